// RangeTransfer: copying a key range to a spare server that joins it
// (range_transfer.h, CopyTo; range_install.cc installs the copy on the spare;
// docs/fault-tolerance.md, "Back to full strength").
//
// The primary takes the copy in an exclusive section of its shard pool: every key is
// between two of its rounds (or async applies), so a key's value, open round number,
// push counts and the optimizer's states (per key, and the update count of the
// learning-rate schedule) belong together. In the same section it adds the spare to
// the range's replication targets (Replicator::AddCopying): every change after the
// copy is sent to the spare too, and answered only once the spare acknowledged it.
// A dense key's value is referenced (its token makes a later update copy it first);
// a row_sparse key's table is cloned in the section (its rounds update rows in place).
#include <algorithm>

#include "common/logging.h"
#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/server/range_transfer.h"
#include "pskv/error.h"

namespace pskv {

using dist::CopyPart;
using dist::Kind;
namespace wire = dist::replication_wire;

namespace {

// Value bytes per kKeys message and bytes per kStates message, at most (a key of
// more travels alone; the transport cuts any message into kChunkBytes frames).
constexpr uint64_t kCopyMessageBytes = uint64_t{4} << 20;

Message CopyMessage(std::string body, std::vector<uint64_t> keys, std::vector<uint64_t> lens,
                    Frame vals) {
  Message m;
  m.h.flags = kPush;
  m.h.head = dist::MakeCmd(Kind::kRangeCopy, DType::kUInt8);
  m.h.num_keys = static_cast<uint32_t>(keys.size());
  uint64_t total = 0;
  for (uint64_t l : lens) total += l;
  m.h.vals_len = total;
  m.keys = U64Frame(keys);
  m.lens = U64Frame(lens);
  if (total) m.vals = std::move(vals);
  m.body = std::move(body);
  return m;
}

// One key of a copy: dense (its value referenced; its token makes a later update of
// the key copy the value first) or row_sparse (its table cloned, `rows` > 0).
struct KeyCopy {
  int64_t key;
  ReplyOwner value;
  int64_t round;
  std::map<int, uint64_t> applied;
  int64_t rows;  // row_sparse: the table's rows; 0: dense
};

// kKeys messages of keys [*i, ...) up to kCopyMessageBytes of values (at least one).
Message KeysMessage(const wire::CopyHead& head, const std::vector<KeyCopy>& keys, size_t* i,
                    int num_servers) {
  std::vector<wire::CopyKey> body;
  std::vector<uint64_t> ps, lens;
  std::vector<Frame::Piece> pieces;
  auto owners = std::make_shared<std::vector<ReplyOwner>>();
  uint64_t bytes = 0;
  for (; *i < keys.size() &&
         (ps.empty() || bytes + keys[*i].value.value.nbytes() <= kCopyMessageBytes);
       ++*i) {
    const KeyCopy& k = keys[*i];
    wire::CopyKey& c = body.emplace_back();
    c.key = k.key;
    c.dtype = static_cast<int32_t>(k.value.value.dtype());
    c.rows = k.rows;
    c.round = k.round;
    for (auto& [id, count] : k.applied) c.applied.push_back({id, count});
    ps.push_back(dist::PsKey(k.key, head.range, num_servers));
    lens.push_back(k.value.value.nbytes());
    pieces.push_back({static_cast<const char*>(k.value.value.raw()), k.value.value.nbytes()});
    owners->push_back(k.value);
    bytes += k.value.value.nbytes();
  }
  Frame vals = Frame::Gather(std::move(pieces), owners);
  return CopyMessage(wire::EncodeCopyKeys(head, body), std::move(ps), std::move(lens),
                     std::move(vals));
}

// The messages of a copy: kBegin, the keys, each store's optimizer states, kEnd.
std::vector<Message> CopyMessages(const wire::CopyHead& head, int num_servers, bool sync,
                                  const std::vector<KeyCopy>& keys,
                                  std::map<int, std::string> states) {
  const uint64_t carrier = dist::PsKey(dist::WireKey(0, 0), head.range, num_servers);
  uint64_t value_bytes = 0;
  for (const KeyCopy& k : keys) value_bytes += k.value.value.nbytes();
  std::vector<Message> out;
  wire::CopyBegin begin{sync, keys.size(), value_bytes, {}};
  for (auto& [store, blob] : states) begin.states.emplace_back(store, blob.size());
  out.push_back(CopyMessage(wire::EncodeCopyBegin(head, begin), {carrier}, {0}, {}));
  for (size_t i = 0; i < keys.size();) out.push_back(KeysMessage(head, keys, &i, num_servers));
  for (auto& [store, blob] : states) {
    auto shared = std::make_shared<std::string>(std::move(blob));
    for (uint64_t off = 0; off < shared->size(); off += kCopyMessageBytes) {
      const uint64_t n = std::min<uint64_t>(kCopyMessageBytes, shared->size() - off);
      out.push_back(CopyMessage(wire::EncodeCopyStates(head, {store, off}), {carrier}, {n},
                                Frame::Of(shared->data() + off, n, shared)));
    }
  }
  out.push_back(CopyMessage(wire::EncodeCopyEnd(head), {carrier}, {0}, {}));
  return out;
}

}  // namespace

void RangeTransfer::CopyTo(int to) {
  const int range = range_.index();
  const auto started = Clock::now();
  struct Totals {
    uint64_t bytes = 0;
    size_t keys = 0;
  };
  auto totals = std::make_shared<Totals>();
  pool_->Exclusive([&] {
    std::vector<KeyCopy> keys;
    store_->ForEachKey([&](int64_t k, KeyState& st) {
      keys.push_back({k, ReplyOwner{st.value, st.token}, st.round.round(), st.applied_push, 0});
    });
    for (SparseServer::KeyCopy& k : store_->sparse().Copy()) {
      const int64_t rows = k.table.shape()[0];
      keys.push_back({k.wire_key, ReplyOwner{std::move(k.table), std::make_shared<int>(0)}, k.round,
                      std::move(k.applied_push), rows});
    }
    std::map<int, std::string> states;
    for (auto& [store, opt] : store_->config().optimizers)
      if (opt) states[store] = opt->SaveStates(/*dump_optimizer=*/true);
    const wire::CopyHead head{replicator_->version(), CopyPart::kBegin, range};
    std::vector<Message> out =
        CopyMessages(head, node_->num_servers(), store_->config().sync, keys, std::move(states));
    totals->keys = keys.size();
    for (auto& m : out) totals->bytes += m.h.vals_len + m.body.size();
    const size_t last = out.size() - 1;
    for (size_t i = 0; i < out.size(); ++i) {
      const bool end = i == last;
      replicator_->Send(
          {to}, std::move(out[i]), [this, to, range, end, totals, started](std::exception_ptr e) {
            if (e) {
              try {
                std::rethrow_exception(e);
              } catch (const std::exception& ex) {
                PSKV_WARN(node_->Tag() << ": copy of key range " << range << " to "
                                       << node_->NodeName(to) << ": " << ex.what());
              }
              return;
            }
            if (!end) return;
            const auto ms =
                std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started)
                    .count();
            PSKV_WARN(node_->Tag()
                      << ": " << node_->NodeName(to) << " installed its copy of key range " << range
                      << " (" << totals->keys << " keys, " << totals->bytes << " bytes) " << ms
                      << " ms after the copy was taken");
          });
    }
    // Every change after this section follows the copy to the spare.
    replicator_->AddCopying(range, to);
  });
  PSKV_WARN(node_->Tag() << ": sending " << node_->NodeName(to) << " a copy of key range " << range
                         << " (" << totals->keys << " keys, " << totals->bytes
                         << " bytes); training goes on meanwhile");
}

}  // namespace pskv
