// pskv-launch entry point; see launcher.h and `pskv-launch --help`.
#include <cstdio>
#include <cstring>

#include "launcher/launcher.h"
#include "pskv/error.h"

int main(int argc, char** argv) {
  for (int i = 1; i < argc && std::strcmp(argv[i], "--") != 0; ++i)
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::fputs(pskv::launcher::Usage().c_str(), stdout);
      return 0;
    }
  try {
    return pskv::launcher::Launch(pskv::launcher::ParseArgs(argc, argv));
  } catch (const pskv::Error& e) {
    std::fprintf(stderr, "pskv-launch: %s\nrun `pskv-launch --help` for the options\n", e.what());
    return 2;
  }
}
