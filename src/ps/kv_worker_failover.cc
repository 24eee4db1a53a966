// KVWorker with replicated servers: routing by the range table and sending
// unanswered messages again when a range's primary changes (ps/kv_app.h,
// "Replicated servers"; docs/fault-tolerance.md).
#include <algorithm>

#include "common/logging.h"
#include "ps/kv_app.h"

namespace pskv {

namespace {
bool Listed(const std::vector<int32_t>& ids, int id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}
}  // namespace

void KVWorker::RouteLocked(const std::vector<uint64_t>& keys, uint8_t flags, uint64_t ts,
                           std::vector<std::pair<int, Message>>& msgs, std::vector<Part>& parts) {
  for (size_t p = 0; p < msgs.size(); ++p) {
    auto& [to, m] = msgs[p];
    to = parts[p].server = table_.Primary(parts[p].range);
    m.h.timestamp = ts + p;
    if (flags & kPush) {
      std::vector<uint64_t> counts;
      for (size_t k = parts[p].slice.first; k < parts[p].slice.first + parts[p].slice.count; ++k)
        counts.push_back(++pushes_of_key_[keys[k]]);
      m.body = PushBody::Encode(counts, -1);
      AddressLocked(parts[p], m);
    }
    parts[p].resend = std::make_unique<Message>(m);
  }
}

void KVWorker::LearnHosts() {
  std::call_once(hosts_once_, [this] {
    std::map<int, std::string> hosts;
    for (int id : node_->AllServerIds()) hosts[id] = node_->HostOf(id);
    std::string here = node_->HostOf(node_->id());
    std::lock_guard<std::mutex> lk(mu_);
    hosts_ = std::move(hosts);
    host_ = std::move(here);
  });
}

int KVWorker::AnswererLocked(int range) const {
  auto on_this_host = [&](int id) {
    auto it = hosts_.find(id);
    return !host_.empty() && it != hosts_.end() && it->second == host_;
  };
  if (on_this_host(table_.Primary(range))) return -1;
  for (int id : table_.Replicas(range))
    if (on_this_host(id)) return id;
  return -1;
}

void KVWorker::AddressLocked(Part& part, Message& m) const {
  // Only with PSKV_REPLICAS=1 (a server answers for its primary only there): with more
  // copies a retry after the answerer left could be answered from the primary's state
  // before the other copies acknowledged the round.
  const bool one_key_push_pull = node_->options().replicas == 1 && (m.h.flags & kPush) &&
                                 (m.h.flags & kPull) && part.slice.count == 1;
  part.answerer = one_key_push_pull ? AnswererLocked(part.range) : -1;
  PushBody body = PushBody::Parse(m.body, part.slice.count);
  if (!body.counts.empty()) m.body = PushBody::Encode(body.counts, part.answerer);
}

void KVWorker::OnRangeTable(const RangeTable& table) {
  std::vector<std::pair<int, Message>> again;
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (!table_.Apply(table)) return;
    std::vector<uint64_t> finished;
    for (auto& [id, req] : pending_) {
      for (auto it = req.waiting.begin(); it != req.waiting.end();) {
        Part& part = it->second;
        if (part.range < 0) {  // a command: a server that left the job never answers
          if (!table_.Holds(part.server)) {
            it = req.waiting.erase(it);
            continue;
          }
        } else if (table_.Primary(part.range) != part.server ||
                   (part.answerer >= 0 && !Listed(table_.Replicas(part.range), part.answerer))) {
          // A new primary, or the answerer left the range: the message goes (again) to
          // the range's primary, naming the answerer of this table.
          part.server = table_.Primary(part.range);
          AddressLocked(part, *part.resend);
          again.emplace_back(part.server, *part.resend);
        }
        ++it;
      }
      if (req.waiting.empty()) finished.push_back(id);
    }
    for (uint64_t id : finished)
      if (pending_.count(id)) Finish(id, lk);
  }
  if (!again.empty())
    PSKV_WARN(node_->Tag() << ": sending " << again.size()
                           << " unanswered message(s) again to the new primaries of their ranges");
  for (auto& [to, m] : again) {
    try {
      node_->Send(to, std::move(m));
    } catch (const std::exception& e) {
      PSKV_WARN(node_->Tag() << ": " << e.what());
    }
  }
}

}  // namespace pskv
