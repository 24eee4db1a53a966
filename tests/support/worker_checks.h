// Checks for the worker programs that tests start as processes (dist_worker,
// dist_device_worker): a failed check prints where and why and counts; the program's
// exit status says whether any failed. g_tag names the process in the messages.
#pragma once

#include <cstdio>
#include <string>

namespace pskv::test {

inline int g_failures = 0;
inline std::string g_tag = "worker";

}  // namespace pskv::test

#define CHECK_TRUE(cond, msg)                                                                \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "%s: CHECK FAILED at line %d: %s\n", ::pskv::test::g_tag.c_str(), \
                   __LINE__, std::string(msg).c_str());                                      \
      ++::pskv::test::g_failures;                                                            \
    }                                                                                        \
  } while (0)
