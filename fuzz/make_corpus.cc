// Writes the seed corpus (valid messages of every kind, in the fuzz input format).
#include <cstdio>
#include <string>
#include <vector>

#include "kvstore/distributed/wire/kv_payload.h"
#include "kvstore/distributed/wire/replication_wire.h"
#include "protocol/message.h"
#include "transport/shm/ring_path.h"
#include "transport/tcp/socket_path.h"
#include "transport/upgrade/control_codec.h"

using namespace pskv;

static void WriteRaw(const std::string& dir, const std::string& name, const std::string& out) {
  FILE* fp = std::fopen((dir + "/" + name).c_str(), "wb");
  std::fwrite(out.data(), 1, out.size(), fp);
  std::fclose(fp);
}

static void Write(const std::string& dir, const std::string& name, const Message& m) {
  std::string out;
  for (auto& f : Encode(m)) {
    uint16_t len = static_cast<uint16_t>(f.size);
    out.append(reinterpret_cast<const char*>(&len), 2);
    out.append(f.data, f.size);
  }
  WriteRaw(dir, name, out);
}

int main(int argc, char** argv) {
  std::string dir = argc > 1 ? argv[1] : ".";
  Message data;
  data.h.flags = kRequest | kPush | kPull;
  data.h.num_keys = 2;
  data.h.vals_len = 8;
  std::vector<uint64_t> keys = {1, 5}, lens = {4, 4};
  data.keys = Frame::Copy(keys.data(), 16);
  data.lens = Frame::Copy(lens.data(), 16);
  data.vals = Frame::FromString("abcdefgh");
  Write(dir, "data", data);
  Message cmd;
  cmd.h.flags = kRequest | kCommand;
  cmd.h.head = 2;
  OptimizerConfig opt;
  opt.learning_rate = 0.1;
  cmd.body = payload::EncodeOptimizer(opt);
  Write(dir, "command", cmd);
  Message reg;
  reg.h.control = static_cast<uint8_t>(Control::kRegister);
  NodeDesc d;
  d.host = "127.0.0.1";
  d.port = 9000;
  reg.body = EncodeNodes({d});
  Write(dir, "register", reg);
  Message ack;
  ack.h.control = static_cast<uint8_t>(Control::kAck);
  ack.h.timestamp = 7;
  Write(dir, "ack", ack);
  Message err;
  err.h.flags = kError;
  err.body = "key 3 has not been inited";
  Write(dir, "error", err);

  // Control payloads on their own (the fuzz target decodes the whole input as one).
  WriteRaw(dir, "payload_nodes", payload::EncodeNodeList({d, d}));
  opt.type = "adam";
  opt.lr_schedule.type = "multifactor";
  opt.lr_schedule.steps = {10, 20};
  opt.lr_mult = {{3, 0.5}, {7, 2.0}};
  opt.wd_mult = {{3, 0.0}};
  opt.sum_keys = {8, 9};
  WriteRaw(dir, "payload_optimizer", payload::EncodeOptimizer(opt));
  opt.rule_params = {{"wd_lh", 0.5}};  // a registered rule's own parameter
  WriteRaw(dir, "payload_optimizer_rule_params", payload::EncodeOptimizer(opt));
  CompressionConfig comp;
  comp.type = "2bit";
  comp.threshold = 0.25f;
  WriteRaw(dir, "payload_compression", payload::EncodeCompression(comp));
  payload::InitReport rep;
  rep.entries = {{1, "weight", "float32", "(2,3)"}, {4294967298, "bias", "float16", "(3)"}};
  rep.failures = {{5, "cannot init key 5"}};
  WriteRaw(dir, "payload_init_report", payload::EncodeInitReport(rep));
  WriteRaw(dir, "payload_check_init", payload::EncodeCheckInit({1, 2, 4294967298}));
  payload::RoundStatus st;
  st.deadlocks = {{3, "key 3 round 2: deadlock"}};
  st.lines = {"key 3 round 2 on server 0: waiting for worker 1 for 5 s"};
  WriteRaw(dir, "payload_round_status", payload::EncodeRoundStatus(st));
  WriteRaw(dir, "payload_states_size", payload::EncodeStatesSize(123456));
  WriteRaw(dir, "payload_mode", payload::EncodeMode(true));
  WriteRaw(dir, "payload_has_optimizer", payload::EncodeHasOptimizer(false));
  WriteRaw(dir, "payload_barrier_state", payload::EncodeBarrierState(true));
  payload::RangeTableData table;
  table.version = 2;
  table.ranges = {{9, {11}, {}}, {11, {9}, {13}}};
  table.spares = {15};
  WriteRaw(dir, "payload_range_table", payload::EncodeRangeTable(table));
  WriteRaw(dir, "payload_range_states_sizes", payload::EncodeRangeStatesSizes({{0, 100}, {1, 7}}));
  EmbeddingConfig emb;
  emb.width = 16;
  emb.admission.admit_after = 3;
  emb.ttl_steps = 100;
  WriteRaw(dir, "payload_embedding_table", payload::EncodeEmbeddingTable(emb));

  // Bodies servers send each other (kvstore/distributed/wire/replication_wire.h).
  namespace rw = dist::replication_wire;
  WriteRaw(dir, "repl_round", rw::EncodeRound({5, 12, {{9, 12}, {11, 12}}, {{11, 77, 0, 0x0700}}}));
  WriteRaw(dir, "repl_sparse_round", rw::EncodeSparseRound({5, 3, 40, {{9, 3}}}));
  WriteRaw(dir, "repl_async", rw::EncodeAsyncPushes({5, 9, {{4, 30, 4}, {2, 30, 2}}}));
  const uint64_t init_counts[2] = {1, 1};
  WriteRaw(dir, "repl_forwarded_init",
           rw::EncodeForwardedInit(
               4, 9, std::string(reinterpret_cast<const char*>(init_counts), sizeof init_counts)));
  const rw::CopyHead head{5, dist::CopyPart::kBegin, 1};
  WriteRaw(dir, "copy_begin", rw::EncodeCopyBegin(head, {true, 2, 4096, {{0, 1024}}}));
  WriteRaw(dir, "copy_keys",
           rw::EncodeCopyKeys(head, {{65536, 0, 0, 4, {{9, 3}, {11, 3}}}, {65537, 0, 8, 4, {}}}));
  WriteRaw(dir, "copy_states", rw::EncodeCopyStates(head, {0, 512}));
  WriteRaw(dir, "copy_end", rw::EncodeCopyEnd(head));

  // Path control messages (the whole input is decoded as one).
  auto raw = [](const Frame& f) { return std::string(f.data, f.size); };
  upgrade::Offer ring;
  ring.path = upgrade::PathKind::kRing;
  ring.seq = 3;
  ring.nonce.fill(0xab);
  ring.details = shm::EncodeRingDetails({4242, 17, 18, 8 << 20, "boot-id/4026531992/4026531836"});
  WriteRaw(dir, "ctl_offer_ring", raw(upgrade::EncodeControl(ring)));
  upgrade::Offer tcp;
  tcp.path = upgrade::PathKind::kTcp;
  tcp.seq = 4;
  tcp.nonce.fill(0xcd);
  tcp.details = direct::EncodeTcpDetails({0x0100007f, 40123});
  WriteRaw(dir, "ctl_offer_tcp", raw(upgrade::EncodeControl(tcp)));
  upgrade::Switch sw;
  sw.nonce.fill(0xcd);
  WriteRaw(dir, "ctl_switch", raw(upgrade::EncodeControl(sw)));
  return 0;
}
