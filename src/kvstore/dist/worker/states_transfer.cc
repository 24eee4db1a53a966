#include "kvstore/dist/worker/states_transfer.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>

#include "kvstore/dist_protocol.h"
#include "kvstore/states_file.h"
#include "protocol/payload.h"
#include "pskv/error.h"

namespace pskv::dist {

void SaveServerStates(ServerLink& link, const std::string& fname, bool dump_optimizer) {
  const int S = link.node()->num_servers();
  const int store = link.store_id();
  auto sizes = link.Command(StoreCommand(kStatesSize, store), "");
  std::vector<uint64_t> keys, lens;
  uint64_t total = 0;
  for (int r = 0; r < S; ++r) {
    keys.push_back(PsKey(WireKey(store, 0), r, S));
    lens.push_back(payload::DecodeStatesSize(sizes[static_cast<size_t>(r)]));
    total += lens.back();
  }
  auto buf = std::shared_ptr<char[]>(new char[total ? total : 1]);
  auto done = std::make_shared<Completion>();
  // The callback holds the buffer: a reply arriving after a timeout writes into live
  // memory (and a cancelled request receives nothing at all).
  auto ts = link.worker()->Pull(keys, buf.get(), lens, MakeCmd(Kind::kStates, DType::kUInt8),
                                [done, buf](std::exception_ptr e) { done->Set(e); });
  link.Await(ts, done, "saving optimizer states");
  if (dump_optimizer) {
    uint64_t off = 0;
    for (auto l : lens) {  // the mark is in the blob's first 8 bytes
      std::string head(buf.get() + off, std::min<uint64_t>(l, 8));
      states::MarkDumped(&head);
      std::memcpy(buf.get() + off, head.data(), head.size());
      off += l;
    }
  }
  std::ofstream f(fname, std::ios::binary | std::ios::trunc);
  const std::string head = states::EncodeDistHeader(lens);
  f.write(head.data(), static_cast<std::streamsize>(head.size()));
  f.write(buf.get(), static_cast<std::streamsize>(total));
  f.close();
  if (!f) throw IOError("cannot write optimizer states to '" + fname + "'");
}

void LoadServerStates(ServerLink& link, const std::string& fname) {
  std::ifstream f(fname, std::ios::binary | std::ios::ate);
  if (!f) throw IOError("cannot open optimizer states file '" + fname + "'");
  const auto file_size = static_cast<uint64_t>(f.tellg());
  f.seekg(0);
  auto data = std::make_shared<std::string>(file_size, '\0');
  if (!f.read(data->data(), static_cast<std::streamsize>(file_size)))
    throw IOError("cannot read optimizer states file '" + fname + "'");
  const int S = link.node()->num_servers();
  const states::DistFile file = states::DecodeDistFile(*data, fname);
  if (file.blobs.size() != static_cast<size_t>(S))
    throw UsageError("the optimizer states were saved from " + std::to_string(file.blobs.size()) +
                     " servers but this job has " + std::to_string(S) +
                     "; restore with the same number of servers");
  // The servers' blobs as one buffer (a version 2 file holds them so already).
  std::vector<uint64_t> lens;
  for (auto b : file.blobs) lens.push_back(b.size());
  uint64_t at = static_cast<uint64_t>(file.blobs[0].data() - data->data());
  if (file.version != 2) {
    auto packed = std::make_shared<std::string>();
    for (auto b : file.blobs) packed->append(b);
    data = packed;
    at = 0;
  }
  std::vector<uint64_t> keys;
  for (int r = 0; r < S; ++r) keys.push_back(PsKey(WireKey(link.store_id(), 0), r, S));
  Frame vals;
  vals.data = data->data() + at;
  vals.size = data->size() - at;
  vals.owner = data;
  auto done = std::make_shared<Completion>();
  auto ts = link.worker()->Push(keys, vals, lens, MakeCmd(Kind::kStates, DType::kUInt8),
                                Completion::Callback(done));
  link.Await(ts, done, "loading optimizer states");
}

}  // namespace pskv::dist
