// ExpectProtocolError: the decoders' tests' one check of a refused input.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "pskv/error.h"

namespace pskv::testing_support {

// Expects `f` to throw ProtocolError whose message contains `what`.
inline void ExpectProtocolError(const std::function<void()>& f, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "no ProtocolError (expected '" << what << "')";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

}  // namespace pskv::testing_support
