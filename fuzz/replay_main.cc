// Replays a fuzz corpus through LLVMFuzzerTestOneInput without libFuzzer (so the
// corpus runs in every build, with any compiler). Usage: replay FILE|DIR...
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  size_t n = 0;
  for (int i = 1; i < argc; ++i) {
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(argv[i])) {
      for (auto& e : std::filesystem::directory_iterator(argv[i])) files.push_back(e.path());
    } else {
      files.push_back(argv[i]);
    }
    for (auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      std::vector<char> buf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(buf.data()), buf.size());
      ++n;
    }
  }
  std::printf("replayed %zu inputs\n", n);
  return n > 0 ? 0 : 1;
}
