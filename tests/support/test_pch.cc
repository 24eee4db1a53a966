// Owner of the tests' precompiled header (tests/support/test_pch.h): a program that
// links like every GoogleTest program here, so its header's flags are theirs.
#include "support/test_pch.h"
