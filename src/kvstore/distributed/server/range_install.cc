// RangeTransfer: installing a copy of a key range on a spare server that joins it
// (range_transfer.h, TakenByCopy; range_copy.cc takes and sends the copy;
// docs/fault-tolerance.md, "Back to full strength").
//
// Messages to one node may arrive out of their send order (small ones overtake big
// ones waiting for the send window, docs/design.md "Priorities on the wire"), so the
// spare installs parts in any order after the kBegin (small, sent first) and counts
// them; the copy is installed once kEnd and every part announced by kBegin arrived.
// Changes that arrive before that (rounds, inits, states loads from the primary) are
// acknowledged at once and applied, in arrival order, right after the install: they
// all follow the copy, and the spare is not a replica (cannot be promoted) until it
// has applied them and reported the install to the scheduler.
#include <algorithm>
#include <climits>
#include <cstring>

#include "common/logging.h"
#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/server/range_transfer.h"
#include "kvstore/distributed/server/replica_apply.h"
#include "pskv/error.h"

namespace pskv {

using dist::CopyPart;
using dist::Kind;
namespace wire = dist::replication_wire;

namespace {

// The bound on a copy's optimizer states for its values: every slot and master copy
// is float32, one per weight element (at most 8 per element of a 2-byte weight with
// two slots and a master copy), plus a header per key.
uint64_t StatesBound(uint64_t value_bytes, uint64_t keys) {
  return 8 * value_bytes + 4096 * (keys + 1) + (uint64_t{1} << 20);
}

}  // namespace

bool RangeTransfer::TakenByCopy(KVRequest& req) {
  const Kind kind = dist::CmdKind(req.cmd);
  if (kind != Kind::kRangeCopy) {
    if (!copy_in_ || !IsServerId(req.sender)) return false;
    // A change of the range from its primary, after the copy: acknowledged now,
    // applied once the copy is installed.
    store_->answers().Ack(req);
    if (!copy_in_->failed) {
      copy_in_->held.push_back(std::move(req));
      InstallIfComplete();
    }
    return true;
  }
  std::string why;
  CopyPart part = CopyPart::kBegin;
  try {
    // The sender's range-table version is NotFromPrimary's to check.
    const wire::CopyHead head = wire::ParseCopyHead(req.msg.body);
    part = head.part;
    if (head.range != range_.index())
      why = "a part of key range " + std::to_string(head.range) + " sent to key range " +
            std::to_string(range_.index());
  } catch (const std::exception& e) {
    why = e.what();
  }
  if (why.empty() && !IsServerId(req.sender)) why = "not from a server";
  if (why.empty()) why = NotFromPrimary(*node_, range_.index(), req);
  if (why.empty() && part == CopyPart::kBegin) {
    copy_in_ = std::make_unique<CopyIn>();
    copy_in_->from = req.sender;
    copy_in_->started = Clock::now();
  }
  if (why.empty() && (!copy_in_ || copy_in_->from != req.sender))
    why = "a part of a copy that did not begin";
  if (why.empty() && copy_in_->failed) why = "the copy was refused before";
  if (why.empty()) why = pool_->Exclusive([&] { return InstallPart(req, part); });
  if (!why.empty()) {
    PSKV_ERROR(node_->Tag() << ": cannot install the copy of key range " << range_.index()
                            << " from " << node_->NodeName(req.sender) << ": " << why
                            << "; this server does not join the range");
    if (copy_in_) {
      copy_in_->failed = true;
      copy_in_->held.clear();
    }
    store_->answers().Error(req, {ErrorKind::kInvalid, "copy of key range: " + why});
    return true;
  }
  CopyIn& in = *copy_in_;
  in.bytes += req.msg.h.vals_len + req.msg.body.size();
  if (part == CopyPart::kEnd)
    in.end = std::make_unique<KVRequest>(std::move(req));  // answered once installed
  else
    store_->answers().Ack(req);
  InstallIfComplete();
  return true;
}

void RangeTransfer::InstallIfComplete() {
  CopyIn& in = *copy_in_;
  // A test may hold the install back until changes that followed the copy arrived.
  const uint64_t hold = node_->fail_points().CopyHoldChanges();
  const bool complete = in.end && in.keys == in.got_keys && in.value_bytes == in.got_values &&
                        in.held.size() >= hold &&
                        std::all_of(in.states.begin(), in.states.end(), [&](const auto& s) {
                          return s.second.size() == in.states_size[s.first];
                        });
  if (!complete) return;
  if (std::string err = pool_->Exclusive([&] { return InstallEnd(); }); !err.empty()) {
    PSKV_ERROR(node_->Tag() << ": cannot install the copy of key range " << range_.index()
                            << " from " << node_->NodeName(in.from) << ": " << err
                            << "; this server does not join the range");
    in.failed = true;
    in.held.clear();
    store_->answers().Error(*in.end, {ErrorKind::kInvalid, "copy of key range: " + err});
    return;
  }
  std::unique_ptr<CopyIn> done = std::move(copy_in_);
  store_->answers().Ack(*done->end);
  PSKV_WARN(
      node_->Tag()
      << ": installed the copy of key range " << range_.index() << " from "
      << node_->NodeName(done->from) << " (" << done->keys << " keys, " << done->bytes << " bytes, "
      << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - done->started).count()
      << " ms); applying the " << done->held.size() << " change(s) that followed it");
  for (auto& held : done->held) rehandle_(std::move(held));
  node_->ReportRangeCopied(range_.index(), done->from, done->bytes);
}

std::string RangeTransfer::InstallPart(const KVRequest& req, CopyPart part) {
  const Message& m = req.msg;
  try {
    switch (part) {
      case CopyPart::kBegin:
        return InstallBegin(req);
      case CopyPart::kKeys:
        return InstallKeys(req);
      case CopyPart::kStates:
        return InstallStates(req);
      case CopyPart::kEnd:
        wire::ParseCopyEnd(m.body);
        return {};
    }
  } catch (const std::exception& e) {
    return e.what();
  }
  return "an unknown part";
}

// kBegin: what the copy holds; sizes are checked before anything is reserved.
std::string RangeTransfer::InstallBegin(const KVRequest& req) {
  CopyIn& in = *copy_in_;
  const Message& m = req.msg;
  const wire::CopyBegin begin = wire::ParseCopyBegin(m.body);
  in.sync = begin.sync;
  in.keys = begin.keys;
  in.value_bytes = begin.value_bytes;
  const auto& sizes = begin.states;
  if (in.value_bytes > kMaxVals || in.keys > in.value_bytes + 1 ||
      sizes.size() > static_cast<size_t>(dist::kMaxStores))
    return "a copy of " + std::to_string(in.keys) + " keys and " + std::to_string(in.value_bytes) +
           " value bytes is beyond the bounds";
  const uint64_t bound = StatesBound(in.value_bytes, in.keys);
  uint64_t all = 0;
  for (const auto& size : sizes) all += std::min(size.second, bound + 1);
  // Sizes checked before anything is reserved.
  if (all > bound)
    return std::to_string(all) + " bytes of optimizer states for " +
           std::to_string(in.value_bytes) + " value bytes (at most " + std::to_string(bound) + ")";
  for (auto& [store, bytes] : sizes) {
    if (!store_->config().OptimizerOf(dist::WireKey(store, 0)))
      return "store " + std::to_string(store) +
             " has optimizer states on the primary but no optimizer here";
    in.states[store];  // grown as its parts arrive (kStates)
    in.states_size[store] = bytes;
    in.states_got[store] = 0;
  }
  return {};
}

// kStates: a part of a store's optimizer states, in any order.
std::string RangeTransfer::InstallStates(const KVRequest& req) {
  CopyIn& in = *copy_in_;
  const Message& m = req.msg;
  const wire::CopyStates piece = wire::ParseCopyStates(m.body);
  const int store = piece.store;
  const uint64_t off = piece.offset;
  auto it = in.states.find(store);
  if (it == in.states.end() || m.num_keys() != 1) return "states of an unannounced store";
  const uint64_t n = m.len_ptr()[0], size = in.states_size[store];
  if (off > size || n > size - off || in.states_got[store] + n > size)
    return "states beyond the size announced";
  std::string& blob = it->second;
  auto& ahead = in.states_ahead[store];
  if (off < blob.size() || ahead.count(off)) return "a part of the states twice";
  in.states_got[store] += n;
  // Memory follows the bytes that arrived: a part past the blob's end waits aside.
  std::string& to = off == blob.size() ? blob : ahead[off];
  const size_t at = to.size();
  to.resize(at + n);
  m.CopyVals(0, n, to.data() + at);
  for (auto next = ahead.find(blob.size()); next != ahead.end(); next = ahead.find(blob.size())) {
    blob += next->second;
    ahead.erase(next);
  }
  return {};
}

std::string RangeTransfer::InstallKeys(const KVRequest& req) {
  CopyIn& in = *copy_in_;
  const Message& m = req.msg;
  const std::vector<wire::CopyKey> keys = wire::ParseCopyKeys(m.body, m.num_keys());
  uint64_t off = 0;
  for (uint32_t i = 0; i < m.num_keys(); ++i) {
    const int64_t key = keys[i].key;
    const int dt = keys[i].dtype;
    const int64_t rows = keys[i].rows;  // row_sparse: >= 1
    const int64_t round = keys[i].round;
    std::map<int, uint64_t> applied;
    for (const wire::PushCount& c : keys[i].applied) {
      if (!IsJobWorker(c.worker, node_->num_workers()))
        return "a push count of node " + std::to_string(c.worker);
      applied[c.worker] = c.count;
    }
    int64_t wk = 0;
    const uint64_t len = m.len_ptr()[i];
    if (!range_.keys().WireKeyOf(m.key_ptr()[i], &wk) || wk != key)
      return "key " + std::to_string(key) + " is not of this range";
    if (!IsValidDType(dt) || len % DTypeSize(static_cast<DType>(dt)) || round < 1)
      return "key " + std::to_string(dist::KeyOf(key)) + ": a malformed value";
    if (++in.got_keys > in.keys || len > in.value_bytes - in.got_values)
      return "more keys or value bytes than announced";
    if (store_->FindKey(key) || store_->sparse().Holds(key))
      return "key " + std::to_string(dist::KeyOf(key)) + " twice";
    in.got_values += len;
    const DType dtype = static_cast<DType>(dt);
    const int64_t elements = static_cast<int64_t>(len / DTypeSize(dtype));
    if (rows != 0) {  // row_sparse: rows x row_size
      if (rows < 0 || elements == 0 || elements % rows || dist::ChunkOf(key) != 0)
        return "row_sparse key " + std::to_string(dist::KeyOf(key)) + ": a malformed table";
      SparseServer::KeyCopy copy{key, NDArray({rows, elements / rows}, dtype), round,
                                 std::move(applied)};
      m.CopyVals(off, len, static_cast<char*>(copy.table.raw()));
      if (std::string why = store_->sparse().Install(std::move(copy)); !why.empty()) return why;
    } else {
      KeyState& st = store_->AddKey(key, NDArray({elements}, dtype));
      m.CopyVals(off, len, static_cast<char*>(st.value.raw()));
      st.round.StartAt(round);
      st.applied_push = std::move(applied);
    }
    off += len;
  }
  return {};
}

// Exclusive: every part arrived; loads the optimizer states (which replace the
// optimizers' configuration with the primary's) and the mode.
std::string RangeTransfer::InstallEnd() {
  CopyIn& in = *copy_in_;
  try {
    for (auto& [store, blob] : in.states) {
      Optimizer* optimizer = store_->config().OptimizerOf(dist::WireKey(store, 0));
      optimizer->LoadStates(
          blob, [this, store](int64_t key) { return store_->StatesKeyWeight(store, key); });
    }
  } catch (const std::exception& e) {
    return std::string("its optimizer states do not load: ") + e.what();
  }
  store_->config().sync = in.sync;
  return {};
}

}  // namespace pskv
