// A dist table's administrative requests (issue 41 items 3, 6): the codec
// (kvstore/distributed/wire/embedding_admin_codec.h) against hostile bytes, the save
// files' discovery (embedding/table_files.h), and a real server (a DistServer over TCP
// on 127.0.0.1, raw KVWorkers: the bytes sent are the bytes tested) answering save,
// restore, export, counters and outcomes, refusing each attack alone.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>

#include "common/observe.h"
#include "embedding/stats_fields.h"
#include "embedding/table.h"
#include "embedding/table_files.h"
#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/wire/embedding_admin_codec.h"
#include "kvstore/distributed/wire/embedding_codec.h"
#include "kvstore/distributed/wire/kv_payload.h"
#include "pskv/error.h"
#include "support/inprocess_job.h"

namespace pskv {
namespace {

using namespace std::chrono_literals;
namespace ea = dist::embedding_admin;
namespace ew = dist::embedding_wire;
namespace fs = std::filesystem;
using dist::Kind;

ea::Request Decoded(const std::string& bytes) {
  return ea::Decode(dist::sparse_wire::Source::Of(bytes));
}
std::string Raw(uint32_t op, uint32_t zero, uint64_t ticket, uint64_t n, const std::string& path) {
  std::string b(24, '\0');
  std::memcpy(b.data(), &op, 4);
  std::memcpy(b.data() + 4, &zero, 4);
  std::memcpy(b.data() + 8, &ticket, 8);
  std::memcpy(b.data() + 16, &n, 8);
  return b + path;
}

TEST(EmbeddingAdminCodec, RoundTripAndEveryMalformedValueRefused) {
  const ea::Request r = Decoded(ea::Encode({ea::Op::kSaveDelta, 42, "/tmp/x"}));
  EXPECT_EQ(r.op, ea::Op::kSaveDelta);
  EXPECT_EQ(r.ticket, 42u);
  EXPECT_EQ(r.path, "/tmp/x");
  EXPECT_EQ(Decoded(ea::Encode({ea::Op::kStats, 0, ""})).op, ea::Op::kStats);
  EXPECT_THROW(Decoded("short"), InvalidArgument);                               // < head
  EXPECT_THROW(Decoded(Raw(9, 0, 1, 1, "d")), InvalidArgument);                  // unknown op
  EXPECT_THROW(Decoded(Raw(0, 0, 1, 1, "d")), InvalidArgument);                  // op 0
  EXPECT_THROW(Decoded(Raw(2, 7, 1, 1, "d")), InvalidArgument);                  // reserved
  EXPECT_THROW(Decoded(Raw(2, 0, 1, uint64_t{1} << 62, "d")), InvalidArgument);  // n lies
  EXPECT_THROW(Decoded(Raw(2, 0, 1, 0, "")), InvalidArgument);                   // no path
  EXPECT_THROW(Decoded(Raw(1, 0, 1, 1, "d")), InvalidArgument);                  // a path on stats
  EXPECT_THROW(Decoded(Raw(2, 0, 1, 3, std::string("a\0b", 3))), InvalidArgument);  // NUL
  const std::string long_path(ea::kMaxPath + 1, 'a');
  EXPECT_THROW(Decoded(Raw(2, 0, 1, long_path.size(), long_path)), InvalidArgument);
}

std::string TempDir(const std::string& name) {
  const fs::path d =
      fs::path(testing::TempDir()) / ("pskv-admin-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}
void Touch(const std::string& dir, const std::string& name) {
  std::ofstream(dir + "/" + name) << "x";
}

TEST(EmbeddingTableFiles, FindsTheNewestChainAndNamesWhatIsMissing) {
  using embedding::SaveFileName;
  const std::string d = TempDir("files");
  EXPECT_THROW(embedding::FindSaved(d, 3), IOError);
  EXPECT_EQ(embedding::LastSavedSeq(d, 3, 0, 2), 0u);
  for (uint32_t s = 0; s < 2; ++s) {
    Touch(d, SaveFileName(3, 1, s, 2, 10, true));
    Touch(d, SaveFileName(3, 2, s, 2, 12, false));
    Touch(d, SaveFileName(3, 3, s, 2, 14, true));
    Touch(d, SaveFileName(3, 4, s, 2, 15, false));
  }
  Touch(d, SaveFileName(4, 9, 0, 1, 1, true));               // another table
  Touch(d, SaveFileName(3, 5, 0, 2, 1, false) + ".tmp123");  // a temporary file
  const embedding::SavedTable t = embedding::FindSaved(d, 3);
  EXPECT_EQ(t.shards, 2u);
  EXPECT_EQ(t.seq, 4u);
  EXPECT_EQ(t.step, 15);
  ASSERT_EQ(t.chains.size(), 2u);
  EXPECT_EQ(fs::path(t.chains[1].full).filename(), SaveFileName(3, 3, 1, 2, 14, true));
  ASSERT_EQ(t.chains[1].deltas.size(), 1u);
  EXPECT_EQ(embedding::LastSavedSeq(d, 3, 1, 2), 4u);
  // Save 6 by shard 0 alone: incomplete; then a gap in shard 1's chain.
  Touch(d, SaveFileName(3, 5, 0, 2, 16, false));
  Touch(d, SaveFileName(3, 6, 0, 2, 17, false));
  // Shard 1 does not count shard 0's save 6, which it may be writing beside it; a
  // save by another server count does count.
  EXPECT_EQ(embedding::LastSavedSeq(d, 3, 1, 2), 4u);
  EXPECT_EQ(embedding::LastSavedSeq(d, 3, 0, 2), 6u);
  EXPECT_EQ(embedding::LastSavedSeq(d, 3, 0, 3), 6u);
  try {
    embedding::FindSaved(d, 3);
    ADD_FAILURE() << "an incomplete save was found";
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find("emb3-000006-1of2-"), std::string::npos) << e.what();
  }
  Touch(d, SaveFileName(3, 6, 1, 2, 17, false));
  try {
    embedding::FindSaved(d, 3);
    ADD_FAILURE() << "a chain with a gap was found";
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find("emb3-000005-1of2-"), std::string::npos) << e.what();
  }
  // Exports: all shards needed, one server count.
  EXPECT_THROW(embedding::FindExports(d, 3), IOError);
  Touch(d, embedding::ExportFileName(3, 1, 2));
  EXPECT_THROW(embedding::FindExports(d, 3), IOError);
  Touch(d, embedding::ExportFileName(3, 0, 2));
  EXPECT_EQ(embedding::FindExports(d, 3).size(), 2u);
  Touch(d, embedding::ExportFileName(3, 0, 1));
  EXPECT_THROW(embedding::FindExports(d, 3), IOError);
}

constexpr int kTable = 7;

// A counter's word in a stats reply (embedding/stats_fields.h).
template <typename T>
size_t At(T embedding::TableStats::*field) {
  return embedding::StatIndex(field);
}

struct Job {
  InProcessDistJob job{[] {
                         Options o;
                         o.server_threads = 2;
                         o.stall_warning = 0ms;
                         return o;
                       }(),
                       1};
  const uint64_t key = KVWorker::ServerRange(0, 1).first + kTable;

  void Call(const std::string& value, Kind kind, char* out = nullptr, uint64_t out_len = 0) {
    auto c = std::make_shared<Completion>();
    KVWorker& kw = *job.workers[0];
    const int cmd = dist::MakeCmd(kind, DType::kFloat32);
    const uint64_t ts = out ? kw.PushPull({key}, Frame::FromString(value), {value.size()}, out,
                                          {out_len}, cmd, Completion::Callback(c))
                            : kw.Push({key}, Frame::FromString(value), {value.size()}, cmd,
                                      Completion::Callback(c));
    kw.Await(ts, c, 30s, 0ms, "embedding request");
  }
  std::vector<int64_t> Admin(const std::string& value) {
    std::vector<int64_t> w(ea::kReplyWords);
    Call(value, Kind::kEmbeddingAdmin, reinterpret_cast<char*>(w.data()), ea::kReplyBytes);
    return w;
  }
  std::vector<int64_t> Admin(ea::Op op, uint64_t ticket, const std::string& path = "") {
    return Admin(ea::Encode({op, ticket, path}));
  }
  void Push(const std::vector<uint64_t>& ids) {
    std::vector<float> g(ids.size() * 4, 0.25f);
    std::string b(ew::PushBytes(ids.size(), 4), '\0');
    ew::EncodePush(b.data(), 4, ids.data(), ids.size(), g.data());
    Call(b, Kind::kEmbeddingPush);
  }
};

TEST(EmbeddingAdminServer, SavesRestoresCountsAndRefusesHostileRequestsAlone) {
  Job j;
  EmbeddingConfig c;
  c.width = 4;
  c.admission.admit_after = 2;
  EXPECT_THROW(j.Admin(ea::Op::kStats, 0), KeyError);  // no table yet: create it first
  j.Call(payload::EncodeEmbeddingTable(c), Kind::kEmbeddingCreate);
  j.Push({1, 2, 3});
  j.Push({1, 2});
  auto s = j.Admin(ea::Op::kStats, 0);
  EXPECT_EQ(s[At(&embedding::TableStats::live)], 2);
  EXPECT_EQ(s[At(&embedding::TableStats::admitted)], 2);
  EXPECT_EQ(s[At(&embedding::TableStats::dropped_grads)], 3);
  EXPECT_EQ(s[At(&embedding::TableStats::pending_ids)], 1);
  EXPECT_EQ(s[ea::kPartStep], 2);
  // Hostile values: refused alone.
  EXPECT_THROW(j.Admin("short"), InvalidArgument);
  EXPECT_THROW(j.Admin(Raw(9, 0, 1, 1, "d")), InvalidArgument);
  EXPECT_THROW(j.Admin(Raw(2, 0, 1, uint64_t{1} << 62, "d")), InvalidArgument);
  EXPECT_THROW(j.Admin(std::string(24 + ea::kMaxPath + 1, '\x02')), InvalidArgument);
  EXPECT_THROW(j.Call(ea::Encode({ea::Op::kStats, 0, ""}), Kind::kEmbeddingAdmin), InvalidArgument);
  // A delta before any full save: a UsageError, kept as ticket 1's outcome.
  const std::string d = TempDir("server");
  EXPECT_THROW(j.Admin(ea::Op::kSaveDelta, 1, d), UsageError);
  EXPECT_THROW(j.Admin(ea::Op::kOutcome, 1), UsageError);
  EXPECT_THROW(j.Admin(ea::Op::kOutcome, 5), UsageError);  // a ticket that never came
  const auto full = j.Admin(ea::Op::kSaveFull, 2, d);
  EXPECT_GT(full[ea::kBytes], 0);
  EXPECT_EQ(full[ea::kSeq], 1);
  EXPECT_EQ(j.Admin(ea::Op::kOutcome, 2), full);
  j.Push({3, 4});
  EXPECT_EQ(j.Admin(ea::Op::kSaveDelta, 3, d)[ea::kSeq], 2);
  j.Push({1, 4, 5});  // changes rows; the restore goes back to save 2
  EXPECT_EQ(j.Admin(ea::Op::kRestore, 4, d)[ea::kRows], 3);
  s = j.Admin(ea::Op::kStats, 0);
  EXPECT_EQ(s[At(&embedding::TableStats::live)], 3);
  EXPECT_EQ(s[ea::kPartStep], 3);
  EXPECT_GT(j.Admin(ea::Op::kExport, 5, d + "/x")[ea::kBytes], 0);
  // A restore from a directory without a save: IOError naming it; nothing changes.
  EXPECT_THROW(j.Admin(ea::Op::kRestore, 6, d + "/none"), IOError);
  EXPECT_EQ(j.Admin(ea::Op::kStats, 0)[At(&embedding::TableStats::live)], 3);
}

// GET /metrics of this process's endpoint (the whole answer, headers included).
std::string Scrape(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  std::string got;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\n\r\n";
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
      char buf[65536];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) got.append(buf, n);
    }
  }
  ::close(fd);
  return got;
}

// The value of the sample of `metric` for table kTable's part on range 0, or "".
std::string Sample(const std::string& text, const std::string& metric) {
  const std::regex re(metric + "\\{[^}]*table=\"" + std::to_string(kTable) +
                      "\",range=\"0\"\\} ([0-9.e+-]+)\n");
  std::smatch m;
  return std::regex_search(text, m, re) ? m[1].str() : std::string();
}

// Issue 41 item 3: a server's table counters (admitted, evicted, live rows, ...) are
// gauges of its metrics endpoint (PSKV_METRICS_PORT), read at each scrape, and gone
// with the server.
TEST(EmbeddingAdminServer, TheCountersAreGaugesOfTheMetricsEndpoint) {
  Options o;
  o.metrics_port = 23000 + static_cast<int>(::getpid() % 20000);
  o.metrics_host = "127.0.0.1";
  obs::Configure(o, "server");
  const int port = obs::MetricsPort();
  ASSERT_GT(port, 0);
  {
    Job j;
    EmbeddingConfig c;
    c.width = 4;
    c.admission.admit_after = 2;
    c.capacity = 2;
    j.Call(payload::EncodeEmbeddingTable(c), Kind::kEmbeddingCreate);
    j.Push({1, 2, 3});
    j.Push({1, 2});
    std::string text = Scrape(port);
    EXPECT_NE(text.find("# TYPE pskv_embedding_live_rows gauge"), std::string::npos) << text;
    EXPECT_EQ(Sample(text, "pskv_embedding_live_rows"), "2") << text;
    EXPECT_EQ(Sample(text, "pskv_embedding_admitted_rows"), "2") << text;
    EXPECT_EQ(Sample(text, "pskv_embedding_dropped_grads"), "3") << text;
    EXPECT_EQ(Sample(text, "pskv_embedding_evicted_capacity_rows"), "0") << text;
    j.Push({3, 4});  // 3 is admitted: a third row over the capacity of 2 evicts one
    text = Scrape(port);
    const auto s = j.Admin(ea::Op::kStats, 0);
    for (auto [metric, value] :
         {std::pair{"pskv_embedding_live_rows", s[At(&embedding::TableStats::live)]},
          std::pair{"pskv_embedding_admitted_rows", s[At(&embedding::TableStats::admitted)]},
          std::pair{"pskv_embedding_evicted_capacity_rows",
                    s[At(&embedding::TableStats::evicted_capacity)]},
          std::pair{"pskv_embedding_evicted_ttl_rows", s[At(&embedding::TableStats::evicted_ttl)]},
          std::pair{"pskv_embedding_memory_bytes", s[At(&embedding::TableStats::memory_bytes)]}})
      EXPECT_EQ(Sample(text, metric), std::to_string(value)) << metric << "\n" << text;
    EXPECT_EQ(s[At(&embedding::TableStats::admitted)], 3);
    EXPECT_EQ(s[At(&embedding::TableStats::evicted_capacity)], 1);
  }
  EXPECT_EQ(Scrape(port).find("pskv_embedding_"), std::string::npos);  // the server is gone
}

}  // namespace
}  // namespace pskv
