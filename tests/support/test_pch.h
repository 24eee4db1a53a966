// The headers nearly every GoogleTest program here includes, compiled once
// (pskv_test_pch in tests/CMakeLists.txt) and reused by each pskv_gtest target:
// parsing <gtest/gtest.h> and the standard library was ~2.5 s of every test file's
// ~4 s on the 2-core CI machine. Each test file still includes what it uses.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "pskv/error.h"
#include "pskv/kvstore.h"
