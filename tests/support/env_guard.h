// Environment variables a test sets for its own duration: each is unset again when the
// guard goes out of scope (tests that read Options::FromEnv or install fail points).
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

namespace pskv::test {

struct EnvGuard {
  std::vector<std::string> names;
  void Set(const std::string& k, const std::string& v) {
    setenv(k.c_str(), v.c_str(), 1);
    names.push_back(k);
  }
  ~EnvGuard() {
    for (auto& n : names) unsetenv(n.c_str());
  }
};

}  // namespace pskv::test
