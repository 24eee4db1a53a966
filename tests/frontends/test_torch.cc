// Equivalence: dist_sync with 2 workers of batch b == 1 process with batch 2b.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::vector<float> ReadFloats(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

int Sh(const std::string& cmd) {
  int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

void Compare(const std::string& uok, int single_devices, int dist_devices) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const std::string dir = std::filesystem::temp_directory_path().string();
  const std::string a = dir + "/pskv_equiv_single_" + std::to_string(::getpid()),
                    b = dir + "/pskv_equiv_dist_" + std::to_string(::getpid());
  const int steps = 6, batch = 16;
  // (a stream, not operator+ chains: GCC 12's -Warray-bounds misfires on those at -O2)
  std::ostringstream single, dist;
  single << EQUIV << ' ' << a << " local " << uok << ' ' << 2 * batch << ' ' << steps << ' '
         << single_devices;
  dist << LAUNCH << " -n 2 -s 1 --timeout 200 -- " << EQUIV << ' ' << b << " dist_sync " << uok
       << ' ' << batch << ' ' << steps << ' ' << dist_devices;
  ASSERT_EQ(Sh(single.str()), 0);
  ASSERT_EQ(Sh(dist.str()), 0);
  auto x = ReadFloats(a), y = ReadFloats(b);
  ASSERT_EQ(x.size(), y.size());
  ASSERT_GT(x.size(), 50000u);
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(x[i] - y[i])));
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(x[i])));
  }
  EXPECT_LT(max_diff, 2e-5) << "largest weight " << max_abs;
  // and training did move the weights (the test is not comparing two no-ops)
  std::filesystem::remove(a);
  std::filesystem::remove(b);
}

}  // namespace

TEST(TorchEquivalence, ServerOptimizer) {
  Compare("1", 1, 1);
}
TEST(TorchEquivalence, LocalOptimizer) {
  Compare("0", 1, 1);
}
TEST(TorchEquivalence, DevicesSplitTheBatch) {
  Compare("1", 2, 2);
}
