// pskv-launch entry point; see launcher.h and `pskv-launch --help`.
#include <cstdio>

#include "launcher/launcher.h"
#include "pskv/error.h"

int main(int argc, char** argv) {
  try {
    return pskv::launcher::Launch(pskv::launcher::ParseArgs(argc, argv));
  } catch (const pskv::launcher::EarlyExit& e) {
    std::fputs(e.text.c_str(), stdout);
    return e.status;
  } catch (const pskv::Error& e) {
    std::fprintf(stderr, "pskv-launch: %s\nrun `pskv-launch --help` for the options\n", e.what());
    return 2;
  }
}
