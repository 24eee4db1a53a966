#include "kvstore/distributed/worker/states_transfer.h"

#include <chrono>
#include <memory>
#include <thread>

#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/wire/kv_payload.h"
#include "kvstore/states_file.h"
#include "pskv/error.h"

namespace pskv::dist {

states::Layout LayoutOf(const std::vector<const KeyMeta*>& metas, int num_servers) {
  states::Layout out;
  out.reserve(metas.size());
  for (const KeyMeta* m : metas) {
    states::KeyLayout k;
    k.key = m->key;
    k.size = m->size;
    if (m->sparse) {
      // The server's optimizer keeps a row range's state under the key itself.
      for (const RowRange& r : m->ranges)
        k.parts.push_back({r.server, m->key, r.begin * m->row_size, r.count * m->row_size});
    } else {
      for (size_t i = 0; i < m->slices.size(); ++i) {
        const Slice& s = m->slices[i];
        const uint64_t wire = m->ps_keys[i] - KVWorker::ServerRange(s.server, num_servers).first;
        k.parts.push_back({s.server, OptimizerKey(static_cast<int64_t>(wire)), s.offset, s.len});
      }
    }
    out.push_back(std::move(k));
  }
  return out;
}

namespace {

// Replicated servers' kStatesSize replies (one per live server; empty for a server
// that left) into each range's size; false if a range is missing.
bool RangeStatesSizes(const std::vector<std::string>& bodies, std::vector<uint64_t>* lens) {
  std::vector<bool> known(lens->size(), false);
  for (const std::string& body : bodies) {
    if (body.empty()) continue;
    for (const auto& [range, bytes] : payload::DecodeRangeStatesSizes(body)) {
      if (range < 0 || static_cast<size_t>(range) >= lens->size())
        throw ProtocolError("optimizer states sizes of key range " + std::to_string(range) +
                            ", which this job does not have");
      (*lens)[static_cast<size_t>(range)] = bytes;
      known[static_cast<size_t>(range)] = true;
    }
  }
  for (bool k : known)
    if (!k) return false;
  return true;
}

}  // namespace

void SaveServerStates(ServerLink& link, const LayoutFor& layout, const std::string& fname,
                      bool dump_optimizer) {
  const int S = link.node()->num_servers();
  const int store = link.store_id();
  std::vector<uint64_t> keys, lens(static_cast<size_t>(S), 0);
  if (link.node()->replicated()) {
    // Each live server names the ranges it is primary of (after a failover, the
    // promoted ones too); the pulls below go to the ranges' primaries. A server that
    // died during the command leaves its ranges unnamed until the survivors have the
    // new range table: asked again, briefly.
    const auto until = std::chrono::steady_clock::now() + link.options().op_timeout;
    while (!RangeStatesSizes(link.Command(StoreCommand(kStatesSize, store), ""), &lens)) {
      if (std::chrono::steady_clock::now() >= until)
        throw NodeFailure(
            "saving optimizer states: a key range has no live primary that "
            "reports its states (the range table did not settle within "
            "PSKV_TIMEOUT); save again");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  } else {
    auto sizes = link.Command(StoreCommand(kStatesSize, store), "");
    for (int r = 0; r < S; ++r)
      lens[static_cast<size_t>(r)] = payload::DecodeStatesSize(sizes[static_cast<size_t>(r)]);
  }
  uint64_t total = 0;
  for (int r = 0; r < S; ++r) {
    keys.push_back(PsKey(WireKey(store, 0), r, S));
    total += lens[static_cast<size_t>(r)];
  }
  auto buf = std::shared_ptr<char[]>(new char[total ? total : 1]);
  auto done = std::make_shared<Completion>();
  // The callback holds the buffer: a reply arriving after a timeout writes into live
  // memory (and a cancelled request receives nothing at all).
  auto ts = link.worker()->Pull(keys, buf.get(), lens, MakeCmd(Kind::kStates, DType::kUInt8),
                                [done, buf](std::exception_ptr e) { done->Set(e); });
  link.Await(ts, done, "saving optimizer states");
  std::vector<std::string_view> blobs;
  uint64_t off = 0;
  for (uint64_t l : lens) {
    blobs.emplace_back(buf.get() + off, l);
    off += l;
  }
  states::WriteStatesFile(fname, [&](const states::BlobWriter::Sink& out) {
    states::GatherWholeKeys(blobs, layout(S), dump_optimizer, out);
  });
}

void LoadServerStates(ServerLink& link, const LayoutFor& layout, const std::string& fname) {
  auto data = std::make_shared<std::string>(states::ReadStatesFile(fname));
  const int S = link.node()->num_servers();
  // What to send: every server's blob back to back, from byte `at` of `send`.
  auto send = data;
  uint64_t at = 0;
  std::vector<uint64_t> lens;
  if (states::IsPerServerDistFile(*data)) {
    const states::DistFile file = states::DecodeDistFile(*data, fname);
    const int saved = static_cast<int>(file.blobs.size());
    if (saved == S) {  // as saved (a version 2 file holds the blobs back to back already)
      for (auto b : file.blobs) lens.push_back(b.size());
      at = static_cast<uint64_t>(file.blobs[0].data() - data->data());
      if (file.version != 2) {
        send = std::make_shared<std::string>();
        for (auto b : file.blobs) send->append(b);
        at = 0;
      }
    } else {
      // Put the keys back together as the saving job placed them, then re-slice.
      std::string whole;
      try {
        states::GatherWholeKeys(file.blobs, layout(saved), false,
                                [&whole](const char* p, size_t n) { whole.append(p, n); });
      } catch (const InternalError& e) {
        throw UsageError("the optimizer states in '" + fname + "' were saved by " +
                         std::to_string(saved) + " servers in a per-server format that " +
                         "does not fit this store's keys (" + e.what() + "); load them with " +
                         std::to_string(saved) + " servers");
      }
      states::BlobView view = states::IndexBlob(whole);
      // The per-server format marks every blob: the file's first says for all.
      view.dumped = states::IndexBlob(file.blobs[0]).dumped;
      send = std::make_shared<std::string>();
      lens = states::SplitWholeKeys(view, layout(S), S, send.get());
    }
  } else {
    send = std::make_shared<std::string>();
    lens = states::SplitWholeKeys(states::IndexBlob(*data), layout(S), S, send.get());
    data.reset();
  }
  std::vector<uint64_t> keys;
  for (int r = 0; r < S; ++r) keys.push_back(PsKey(WireKey(link.store_id(), 0), r, S));
  Frame vals;
  vals.data = send->data() + at;
  vals.size = send->size() - at;
  vals.owner = send;
  auto done = std::make_shared<Completion>();
  auto ts = link.worker()->Push(keys, vals, lens, MakeCmd(Kind::kStates, DType::kUInt8),
                                Completion::Callback(done));
  link.Await(ts, done, "loading optimizer states");
}

}  // namespace pskv::dist
