// The server role's entry point under the name kvstore_dist.cc includes; new code
// includes kvstore/dist/server/role_main.h.
#pragma once

#include "kvstore/dist/server/role_main.h"
