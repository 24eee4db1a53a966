// See device_results.h. The listener registers itself before main (gtest_main) runs.
#include "support/device_results.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "pskv/device.h"

namespace pskv::test {
namespace {

struct Current {
  std::mutex mu;
  uint64_t hash = 14695981039346656037ull;  // FNV-1a 64 offset basis
  uint64_t results = 0, bytes = 0;
};

Current& State() {
  static Current c;
  return c;
}

std::string Escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) continue;
    out += ch;
  }
  return out;
}

class ResultsListener : public ::testing::EmptyTestEventListener {
 public:
  explicit ResultsListener(std::string path) : path_(std::move(path)) {}

  void OnTestStart(const ::testing::TestInfo&) override {
    std::lock_guard<std::mutex> lock(State().mu);
    State().hash = 14695981039346656037ull;
    State().results = State().bytes = 0;
    cuda::ResetStats();  // plain counters: never initialises a device
  }

  void OnTestEnd(const ::testing::TestInfo& info) override {
    const ::testing::TestResult* r = info.result();
    const char* outcome = r->Skipped() ? "skipped" : (r->Passed() ? "passed" : "failed");
    const cuda::Counters c = cuda::Stats();
    std::lock_guard<std::mutex> lock(State().mu);
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(State().hash));
    std::ostringstream o;
    o << "    {\"test\": \"" << Escape(std::string(info.test_suite_name()) + "." + info.name())
      << "\", \"outcome\": \"" << outcome << "\", \"checksum\": \"" << hash
      << "\", \"results\": " << State().results << ", \"result_bytes\": " << State().bytes
      << ", \"counters\": {\"d2h_bytes\": " << c.d2h_bytes << ", \"d2h_count\": " << c.d2h_count
      << ", \"h2d_bytes\": " << c.h2d_bytes << ", \"h2d_count\": " << c.h2d_count
      << ", \"d2d_bytes\": " << c.d2d_bytes << ", \"d2d_count\": " << c.d2d_count
      << ", \"peer_bytes\": " << c.peer_bytes << ", \"peer_count\": " << c.peer_count
      << ", \"kernel_launches\": " << c.kernel_launches << "}}";
    entries_.push_back(o.str());
  }

  void OnTestProgramEnd(const ::testing::UnitTest&) override {
    std::ofstream f(path_, std::ios::trunc);
    const bool sim = cuda::Initialized() && cuda::Simulated();
    // devices: 0 when no test touched a device or none was usable (no GPU): the GPU run
    // then ran nothing on a GPU, whatever its tests that need no device did.
    f << "{\n  \"backend\": \"" << (cuda::Initialized() ? (sim ? "simulated" : "cuda") : "none")
      << "\",\n  \"devices\": " << (cuda::Initialized() ? cuda::DeviceCount() : 0)
      << ",\n  \"tests\": [\n";
    for (size_t i = 0; i < entries_.size(); ++i)
      f << entries_[i] << (i + 1 < entries_.size() ? ",\n" : "\n");
    f << "  ]\n}\n";
    if (!f) std::fprintf(stderr, "device_results: cannot write %s\n", path_.c_str());
  }

 private:
  std::string path_;
  std::vector<std::string> entries_;
};

// Test code reads its own switches (the library reads the environment in env_table.cc only).
[[maybe_unused]] const bool kRegistered = [] {
  const char* path = std::getenv("PSKV_TEST_RESULTS_JSON");
  if (path == nullptr || *path == '\0') return false;
  ::testing::UnitTest::GetInstance()->listeners().Append(new ResultsListener(path));
  return true;
}();

}  // namespace

void RecordDeviceResult(const void* data, size_t bytes) {
  std::lock_guard<std::mutex> lock(State().mu);
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = State().hash;
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  State().hash = h;
  State().results += 1;
  State().bytes += bytes;
}

}  // namespace pskv::test
