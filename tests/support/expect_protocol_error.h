// The decoders' tests' shared pieces: ExpectProtocolError, their one check of a refused
// input, and SampleNodeDesc, a node description with every field set.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "protocol/message.h"
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

// A NodeDesc with every field set to a non-default value.
inline NodeDesc SampleNodeDesc() {
  NodeDesc d;
  d.id = 9;
  d.role = 1;
  d.rank = 2;
  d.host = "10.0.0.1";
  d.port = 9100;
  d.token = 0xfeedbeef;
  d.rank_hint = 3;
  return d;
}

}  // namespace pskv::testing_support
