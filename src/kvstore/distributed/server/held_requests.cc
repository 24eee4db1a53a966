// HeldRequests (distributed/server/held_requests.h).
#include "kvstore/distributed/server/held_requests.h"

#include <algorithm>

namespace pskv {

uint64_t HeldRequests::ChargeOf(const KVRequest& req) {
  const Message& m = req.msg;
  const uint64_t bytes = m.h.vals_len + m.keys.size + m.lens.size + m.body.size();
  return std::max(bytes, kMinCharge);
}

std::string HeldRequests::Hold(int range, KVRequest&& req, const std::string& who) {
  const uint64_t charge = ChargeOf(req);
  uint64_t& held = bytes_[req.sender];
  if (held + charge > max_bytes_) {
    ++refused_;
    if (held == 0) bytes_.erase(req.sender);
    return who + " holds " + std::to_string(held) + " bytes of this worker's requests for key " +
           "ranges it does not lead yet (held until the range table that makes it their primary " +
           "arrives); this one (" + std::to_string(charge) +
           " bytes) would pass PSKV_HELD_REQUEST_BYTES=" + std::to_string(max_bytes_) +
           ": raise it if the requests a worker has in flight to one key range are bigger "
           "(docs/fault-tolerance.md, \"Promotion on the servers\")";
  }
  held += charge;
  by_range_[range].push_back(std::move(req));
  return {};
}

std::vector<KVRequest> HeldRequests::Release(int range) {
  auto node = by_range_.extract(range);
  if (node.empty()) return {};
  for (const KVRequest& r : node.mapped()) {
    auto it = bytes_.find(r.sender);
    it->second -= ChargeOf(r);
    if (it->second == 0) bytes_.erase(it);
  }
  return std::move(node.mapped());
}

std::vector<KVRequest> HeldRequests::TakeAll() {
  std::vector<KVRequest> all;
  for (auto& [range, reqs] : by_range_)
    for (auto& r : reqs) all.push_back(std::move(r));
  by_range_.clear();
  bytes_.clear();
  return all;
}

size_t HeldRequests::Count(int range) const {
  auto it = by_range_.find(range);
  return it == by_range_.end() ? 0 : it->second.size();
}

uint64_t HeldRequests::BytesOf(int sender) const {
  auto it = bytes_.find(sender);
  return it == bytes_.end() ? 0 : it->second;
}

}  // namespace pskv
