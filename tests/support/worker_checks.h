// Checks for the worker programs that tests start as processes (dist_worker,
// dist_device_worker): a failed check prints where and why and counts; the program's
// exit status says whether any failed. g_tag names the process in the messages.
#pragma once

#include <cstdio>
#include <cstring>
#include <string>

#include "pskv/error.h"

namespace pskv::test {

inline int g_failures = 0;
inline std::string g_tag = "worker";

// True if `f` throws an `E` (a pskv::Error by default) whose message contains
// `needle`; else prints what happened instead and returns false.
template <typename E = Error, typename F>
bool Throws(F&& f, const char* needle) {
  try {
    f();
  } catch (const E& e) {
    if (std::strstr(e.what(), needle)) return true;
    std::fprintf(stderr, "%s: error '%s' lacks '%s'\n", g_tag.c_str(), e.what(), needle);
    return false;
  }
  std::fprintf(stderr, "%s: no error of the expected type (expected one mentioning '%s')\n",
               g_tag.c_str(), needle);
  return false;
}

}  // namespace pskv::test

#define CHECK_TRUE(cond, msg)                                                                \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "%s: CHECK FAILED at line %d: %s\n", ::pskv::test::g_tag.c_str(), \
                   __LINE__, std::string(msg).c_str());                                      \
      ++::pskv::test::g_failures;                                                            \
    }                                                                                        \
  } while (0)
