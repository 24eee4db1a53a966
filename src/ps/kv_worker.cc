// KVWorker: requests sliced by server key ranges, replies matched to them
// (ps/kv_app.h).
#include "common/logging.h"
#include "common/observe.h"  // [observe]
#include "common/stall.h"
#include "ps/kv_app.h"
#include "pskv/error.h"

namespace pskv {

// ------------------------------------------------------------------ worker

KVWorker::KVWorker(Node* node) : node_(node), replicated_(node->replicated()) {
  node_->SetDataHandler([this](Message&& m) { OnMessage(std::move(m)); });
  node_->AddFailureHandler([this](std::exception_ptr e) { OnFailure(e); });
  if (replicated_) {
    table_ = node_->range_table();
    node_->AddRangeTableHandler([this](const RangeTable& t) { OnRangeTable(t); });
  }
}

size_t KVWorker::Pending() const {
  std::lock_guard<std::mutex> lk(mu_);
  return pending_.size();
}

uint64_t KVWorker::Push(const std::vector<uint64_t>& keys, Frame vals,
                        const std::vector<uint64_t>& lens, int cmd, Callback cb, int priority,
                        uint64_t ahead, uint64_t message_bytes) {
  return Issue(keys, std::move(vals), lens, nullptr, {}, {}, cmd, kPush, std::move(cb), priority,
               ahead, message_bytes);
}

uint64_t KVWorker::Pull(const std::vector<uint64_t>& keys, char* out,
                        const std::vector<uint64_t>& lens, int cmd, Callback cb, int priority) {
  std::vector<uint64_t> zero(keys.size(), 0);
  return Issue(keys, Frame{}, zero, out, {}, lens, cmd, kPull, std::move(cb), priority);
}

uint64_t KVWorker::Pull(const std::vector<uint64_t>& keys, std::vector<char*> outs,
                        const std::vector<uint64_t>& lens, int cmd, Callback cb, int priority) {
  std::vector<uint64_t> zero(keys.size(), 0);
  return Issue(keys, Frame{}, zero, nullptr, std::move(outs), lens, cmd, kPull, std::move(cb),
               priority);
}

uint64_t KVWorker::PushPull(const std::vector<uint64_t>& keys, Frame vals,
                            const std::vector<uint64_t>& lens, char* out,
                            const std::vector<uint64_t>& out_lens, int cmd, Callback cb,
                            int priority, uint64_t ahead, uint64_t message_bytes) {
  return Issue(keys, std::move(vals), lens, out, {}, out_lens, cmd, kPush | kPull, std::move(cb),
               priority, ahead, message_bytes);
}

uint64_t KVWorker::PushPull(const std::vector<uint64_t>& keys, Frame vals,
                            const std::vector<uint64_t>& lens, std::vector<char*> outs,
                            const std::vector<uint64_t>& out_lens, int cmd, Callback cb,
                            int priority) {
  return Issue(keys, std::move(vals), lens, nullptr, std::move(outs), out_lens, cmd, kPush | kPull,
               std::move(cb), priority);
}

namespace {

// The shapes of a request's arguments agree (programming errors of the layers above).
void CheckShapes(const std::vector<uint64_t>& keys, const Frame& vals,
                 const std::vector<uint64_t>& lens, bool has_out, size_t num_outs,
                 const std::vector<uint64_t>& out_lens) {
  if (keys.size() != lens.size() || (has_out && out_lens.size() != keys.size()) ||
      (num_outs && num_outs != keys.size()))
    throw InternalError("KVWorker: keys and lens differ in length");
  uint64_t total = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i && keys[i] <= keys[i - 1])
      throw InternalError("KVWorker: keys must be strictly ascending");
    total += lens[i];
  }
  if (total != vals.size) throw InternalError("KVWorker: lens do not add up to the values' size");
}

}  // namespace

void KVWorker::Split(const std::vector<uint64_t>& keys, const Frame& vals,
                     const std::vector<uint64_t>& lens, const std::vector<uint64_t>& out_lens,
                     int cmd, uint8_t flags, int priority, uint64_t message_bytes,
                     std::vector<std::pair<int, Message>>& msgs, std::vector<Part>& parts) const {
  const int S = node_->num_servers();
  std::vector<uint64_t> offsets(keys.size() + 1, 0);
  for (size_t i = 0; i < keys.size(); ++i) offsets[i + 1] = offsets[i] + lens[i];
  // One message per server's keys; with wire chunks, a server's keys are cut into
  // messages of about `chunk` bytes (sent or answered) at key boundaries.
  const uint64_t most =
      message_bytes > 0 ? message_bytes : static_cast<uint64_t>(node_->options().wire_chunk_bytes);
  auto key_bytes = [&](size_t k) {
    return std::max(lens[k], out_lens.empty() ? uint64_t{0} : out_lens[k]);
  };
  size_t i = 0;
  for (int r = 0; r < S && i < keys.size(); ++r) {
    auto [begin, end] = ServerRange(r, S);
    size_t j = i;
    uint64_t part = 0;
    while (j < keys.size() && keys[j] >= begin && (keys[j] < end || r + 1 == S))
      part += key_bytes(j++);
    const uint64_t chunk =
        message_bytes > 0 ? std::max<uint64_t>(1, std::min(most, part / kMessagesPerPart)) : most;
    for (size_t a = i; a < j;) {
      size_t b = a + 1;
      uint64_t bytes = key_bytes(a);
      while (b < j && (chunk == 0 || bytes + key_bytes(b) <= chunk)) bytes += key_bytes(b++);
      Message m;
      m.h.flags = kRequest | flags;
      m.h.head = cmd;
      m.h.priority = priority;
      m.h.num_keys = static_cast<uint32_t>(b - a);
      m.h.vals_len = offsets[b] - offsets[a];
      m.keys = U64Frame(std::vector<uint64_t>(keys.begin() + static_cast<long>(a),
                                              keys.begin() + static_cast<long>(b)));
      m.lens = U64Frame(std::vector<uint64_t>(lens.begin() + static_cast<long>(a),
                                              lens.begin() + static_cast<long>(b)));
      m.vals = vals.Slice(offsets[a], offsets[b] - offsets[a]);
      parts.push_back(Part{ServerId(r), Slice{a, b - a}, r, {}});
      msgs.emplace_back(ServerId(r), std::move(m));
      a = b;
    }
    i = j;
  }
}

uint64_t KVWorker::Issue(const std::vector<uint64_t>& keys, Frame vals,
                         const std::vector<uint64_t>& lens, char* out, std::vector<char*> outs,
                         const std::vector<uint64_t>& out_lens, int cmd, uint8_t flags, Callback cb,
                         int priority, uint64_t ahead, uint64_t message_bytes) {
  CheckShapes(keys, vals, lens, out || !outs.empty(), outs.size(), out_lens);
  Request req;
  req.cmd = cmd;
  req.flags = flags;
  req.cb = std::move(cb);
  req.out = out;
  req.outs = std::move(outs);
  req.keys = keys;
  req.out_lens = out_lens;
  req.out_offsets.assign(keys.size() + 1, 0);
  for (size_t i = 0; i < out_lens.size(); ++i)
    req.out_offsets[i + 1] = req.out_offsets[i] + out_lens[i];
  std::vector<std::pair<int, Message>> msgs;
  std::vector<Part> parts;
  Split(keys, vals, lens, out_lens, cmd, flags, priority, message_bytes, msgs, parts);
  Callback done_now;
  uint64_t ts;
  std::vector<size_t> order;  // paced: the messages' send order (PushPacer::SendOrder)
  if (replicated_) LearnHosts();
  {
    std::lock_guard<std::mutex> lk(mu_);
    ts = next_ts_;
    next_ts_ += std::max<size_t>(msgs.size(), 1);
    if (replicated_) RouteLocked(keys, flags, ts, msgs, parts);
    if (msgs.empty()) {
      done_now = std::move(req.cb);
    } else {
      req.num_parts = msgs.size();
      for (size_t p = 0; p < parts.size(); ++p) req.waiting.emplace(ts + p, std::move(parts[p]));
      if (ahead > 0 && msgs.size() > 1 && !replicated_) {
        std::vector<std::pair<int, uint64_t>> plan;
        for (auto& [to, m] : msgs) plan.emplace_back(to, m.h.vals_len);
        req.pacer = std::make_unique<PushPacer>(ahead, plan);
        order = req.pacer->SendOrder();
      }
      for (size_t p = 0; req.pacer && p < msgs.size(); ++p) {
        auto& [to, m] = msgs[p];
        if (req.pacer->Add(p, to, m.h.vals_len)) continue;
        m.h.timestamp = ts + p;
        req.held.emplace(ts + p, std::make_pair(to, std::move(m)));
        to = -1;  // sent when the pacer releases it (OnMessage)
      }
      pending_.emplace(ts, std::move(req));
    }
  }
  if (done_now) {
    done_now(nullptr);
    return ts;
  }
  SendIssued(ts, msgs, order);
  return ts;
}

void KVWorker::SendIssued(uint64_t ts, std::vector<std::pair<int, Message>>& msgs,
                          const std::vector<size_t>& order) {
  for (size_t q = 0; q < msgs.size(); ++q) {
    const size_t p = order.empty() ? q : order[q];
    auto& [to, m] = msgs[p];
    if (to < 0) continue;
    m.h.timestamp = ts + p;
    if (obs::Enabled()) obs::CountPeer(node_->NodeName(to), "out", m.h.vals_len);  // [observe]
    try {
      node_->Send(to, std::move(m));
    } catch (...) {
      // Replicated: a server known to be gone is replaced by the next range table,
      // which sends the message again; a failed send to any other server, or the
      // job's failure, fails the request.
      if (replicated_ && !node_->failure() && node_->ServerLost(to)) continue;
      Fail(ts, std::current_exception());
      return;
    }
  }
}

std::vector<std::string> KVWorker::Command(int head, const std::string& body,
                                           std::chrono::milliseconds timeout,
                                           const std::vector<int>& to) {
  auto done = std::make_shared<Completion>();
  Request req;
  const std::vector<int> ids = to.empty() ? node_->LiveServerIds() : to;
  req.cmd = head;
  req.flags = kCommand;
  auto bodies = std::make_shared<std::vector<std::string>>(
      static_cast<size_t>(node_->num_server_processes()));
  req.bodies = bodies;
  req.cb = Completion::Callback(done);
  uint64_t ts;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ts = next_ts_;
    next_ts_ += std::max<size_t>(ids.size(), 1);
    req.num_parts = ids.size();
    for (size_t p = 0; p < ids.size(); ++p) req.waiting.emplace(ts + p, Part{ids[p], {}, -1, {}});
    pending_.emplace(ts, std::move(req));
  }
  for (size_t p = 0; p < ids.size(); ++p) {
    const int id = ids[p];
    Message m;
    m.h.flags = kRequest | kCommand;
    m.h.head = head;
    m.h.timestamp = ts + p;
    m.body = body;
    try {
      node_->Send(id, std::move(m));
    } catch (...) {
      // Replicated: a server known to be gone counts as answered, as when a range
      // table removes it (OnRangeTable): every range it held has a live copy, and each
      // copy runs the command.
      if (replicated_ && !node_->failure() && node_->ServerLost(id)) {
        std::unique_lock<std::mutex> lk(mu_);
        auto it = pending_.find(ts);
        if (it != pending_.end() && it->second.waiting.erase(ts + p) && it->second.waiting.empty())
          Finish(ts, lk);
        continue;
      }
      Fail(ts, std::current_exception());
      break;
    }
  }
  Await(ts, done, timeout, node_->options().stall_warning, "command " + std::to_string(head));
  return std::move(*bodies);
}

void KVWorker::Await(uint64_t ts, const std::shared_ptr<Completion>& c,
                     std::chrono::milliseconds timeout, std::chrono::milliseconds stall,
                     const std::string& what) {
  using namespace std::chrono;
  const WaitPlan plan{timeout, stall};
  StatusWait status(&node_->status());
  const bool done = WaitReporting(
      plan,
      [&](steady_clock::time_point until) {
        return c->WaitFor(duration_cast<milliseconds>(until - steady_clock::now()) +
                          milliseconds(1));
      },
      [&](milliseconds waited) {
        status.Report(what, WaitedServers(ts), 0, waited);
        std::string missing = Missing(ts);
        PSKV_WARN(node_->Tag() << ": " << what << ": waiting for "
                               << (missing.empty() ? std::string("its completion") : missing)
                               << " for " << duration_cast<seconds>(waited).count() << " s");
      });
  if (done) {
    if (auto e = c->error()) std::rethrow_exception(e);
    return;
  }
  // Timed out: cancel first (under mu_, so no reply handler can still write into
  // the request's buffers afterwards), then report.
  std::string missing = Missing(ts);
  if (!Cancel(ts)) {
    // Completed in the meantime: its callback runs right after the entry is removed
    // (outside the lock); wait for it, briefly.
    if (c->WaitFor(milliseconds(1000))) {
      if (auto e = c->error()) std::rethrow_exception(e);
      return;
    }
  }
  const std::string why = what + ": no answer from " +
                          (missing.empty() ? std::string("the servers") : missing) + " within " +
                          std::to_string(duration_cast<milliseconds>(timeout).count() / 1000.0) +
                          " s (raise PSKV_TIMEOUT if this is expected)";
  status.Fail("TimeoutError", why);
  throw TimeoutError(why);
}

bool KVWorker::Cancel(uint64_t ts) {
  std::lock_guard<std::mutex> lk(mu_);
  return pending_.erase(ts) > 0;
}

std::string KVWorker::MissingLocked(const Request& r) const {
  std::set<int> ids;
  for (auto& [ts, part] : r.waiting) ids.insert(part.server);
  std::string out;
  for (int id : ids) {
    if (!out.empty()) out += ", ";
    out += node_->NodeName(id);
  }
  return out;
}

std::vector<NodeRef> KVWorker::WaitedServers(uint64_t ts) const {
  std::set<int> ids;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& [t, r] : pending_)
      if (ts == 0 || t == ts)
        for (auto& [part_ts, part] : r.waiting) ids.insert(part.server);
  }
  std::vector<NodeRef> out;
  for (int id : ids) out.push_back(NodeRefOf(id));
  return out;
}

std::map<uint64_t, KVWorker::Request>::iterator KVWorker::FindLocked(uint64_t reply_ts) {
  auto it = pending_.upper_bound(reply_ts);
  if (it == pending_.begin()) return pending_.end();
  --it;
  return reply_ts - it->first < it->second.num_parts ? it : pending_.end();
}

std::string KVWorker::Missing(uint64_t ts) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = pending_.find(ts);
  return it == pending_.end() ? std::string() : MissingLocked(it->second);
}

std::vector<std::string> KVWorker::DescribePending(std::chrono::milliseconds min_age) const {
  using namespace std::chrono;
  ReportList report;
  const auto now = steady_clock::now();
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [ts, r] : pending_) {
    if (now - r.issued < min_age) continue;
    if (report.full()) {
      report.Skip();
      continue;
    }
    std::string s = (r.flags & kCommand)                     ? "command " + std::to_string(r.cmd)
                    : (r.flags & kPush) && (r.flags & kPull) ? "push-pull"
                    : (r.flags & kPush)                      ? "push"
                                                             : "pull";
    if (!r.keys.empty()) s += " of ps key " + std::to_string(r.keys.front());
    s += ": waiting for " + MissingLocked(r) + " for " +
         std::to_string(duration_cast<seconds>(now - r.issued).count()) + " s";
    report.Add(std::move(s));
  }
  std::vector<std::string> out = report.items();
  if (report.omitted() > 0) out.push_back("and " + std::to_string(report.omitted()) + " more");
  return out;
}

void KVWorker::Fail(uint64_t ts, std::exception_ptr e) {
  std::unique_lock<std::mutex> lk(mu_);
  auto it = pending_.find(ts);
  if (it == pending_.end()) return;  // completed or failed already
  it->second.error = e;
  Finish(ts, lk);
}

void KVWorker::Finish(uint64_t ts, std::unique_lock<std::mutex>& lk) {
  auto it = pending_.find(ts);
  Request req = std::move(it->second);
  pending_.erase(it);
  lk.unlock();
  if (req.cb) req.cb(req.error);
  lk.lock();
}

std::string KVWorker::TakePullAnswer(const Message& m, const Slice& s, Request& req) {
  if (m.h.num_keys != s.count)
    return "an answer with " + std::to_string(m.h.num_keys) + " keys, expected " +
           std::to_string(s.count);
  for (size_t k = 0; k < s.count; ++k) {
    if (m.key_ptr()[k] != req.keys[s.first + k]) return "an answer for other keys";
    if (m.len_ptr()[k] != req.out_lens[s.first + k])
      return "an answer of " + std::to_string(m.len_ptr()[k]) + " bytes for key " +
             std::to_string(req.keys[s.first + k]) + ", expected " +
             std::to_string(req.out_lens[s.first + k]);
  }
  if (req.out) {
    m.CopyVals(0, m.h.vals_len, req.out + req.out_offsets[s.first]);
    return "";
  }
  uint64_t at = 0;  // scattered: each key to its own output
  for (size_t k = 0; k < s.count; ++k) {
    const uint64_t len = req.out_lens[s.first + k];
    m.CopyVals(at, len, req.outs[s.first + k]);
    at += len;
  }
  return "";
}

void KVWorker::OnMessage(Message&& m) {
  if (m.h.flags & kRequest) {
    PSKV_WARN(node_->Tag() << ": a worker received a request; dropped");
    return;
  }
  std::unique_lock<std::mutex> lk(mu_);
  auto it = FindLocked(m.h.timestamp);
  if (it == pending_.end()) return;  // timed out or failed already
  const uint64_t id = it->first;
  Request& req = it->second;
  auto part = req.waiting.find(m.h.timestamp);
  if (part == req.waiting.end() ||
      (part->second.server != m.h.sender && part->second.answerer != m.h.sender)) {
    // A duplicate, or an answer from a server that was neither asked nor named as the
    // message's answerer: never counted.
    if (node_->options().verbose >= 1)
      PSKV_WARN(node_->Tag() << ": ignored a duplicate or unexpected reply from "
                             << node_->NodeName(m.h.sender) << " to request " << m.h.timestamp);
    return;
  }
  const Slice s = part->second.slice;
  req.waiting.erase(part);
  std::vector<std::pair<int, Message>> go;  // paced messages this answer releases
  if (req.pacer)
    for (size_t p : req.pacer->Answered(m.h.timestamp - id)) {
      auto h = req.held.find(id + p);
      go.push_back(std::move(h->second));
      req.held.erase(h);
    }
  const std::string who = node_->NodeName(m.h.sender);
  if (obs::Enabled()) {  // [observe] per-peer bytes, requests and latency
    obs::CountPeer(who, "in", m.h.vals_len);
    obs::CountPeerOp(who,
                     static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                               std::chrono::steady_clock::now() - req.issued)
                                               .count()),
                     (m.h.flags & kError) != 0);
  }
  if (m.h.flags & kError) {
    if (!req.error) req.error = MakeError(static_cast<ErrorKind>(m.h.head), who + ": " + m.body);
  } else if (m.h.flags & kCommand) {
    int r = RankOfId(m.h.sender);
    if (req.bodies && IsServerId(m.h.sender) && r < static_cast<int>(req.bodies->size()))
      (*req.bodies)[static_cast<size_t>(r)] = m.body;
  } else if ((req.out || !req.outs.empty()) && (m.h.flags & kPull)) {
    std::string problem = TakePullAnswer(m, s, req);
    if (!problem.empty() && !req.error)
      req.error = std::make_exception_ptr(ProtocolError(who + " sent " + problem));
  }
  if (req.waiting.empty()) Finish(id, lk);
  lk.unlock();
  for (auto& [to, msg] : go) {
    if (obs::Enabled()) obs::CountPeer(node_->NodeName(to), "out", msg.h.vals_len);  // [observe]
    try {
      node_->Send(to, std::move(msg));
    } catch (...) {
      Fail(id, std::current_exception());
      return;
    }
  }
}

void KVWorker::OnFailure(std::exception_ptr e) {
  std::unique_lock<std::mutex> lk(mu_);
  while (!pending_.empty()) {
    auto ts = pending_.begin()->first;
    pending_.begin()->second.error = e;
    Finish(ts, lk);
  }
}

}  // namespace pskv
