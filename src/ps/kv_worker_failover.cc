// KVWorker with replicated servers: routing by the range table and sending
// unanswered messages again when a range's primary changes (ps/kv_app.h,
// "Replicated servers"; docs/fault-tolerance.md).
#include "common/logging.h"
#include "ps/kv_app.h"

namespace pskv {

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
      m.body.assign(reinterpret_cast<const char*>(counts.data()), counts.size() * 8);
    }
    parts[p].resend = std::make_unique<Message>(m);
  }
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
        } else if (table_.Primary(part.range) != part.server) {
          part.server = table_.Primary(part.range);
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
