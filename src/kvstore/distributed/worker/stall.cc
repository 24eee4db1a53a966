#include "kvstore/distributed/worker/stall.h"

#include <algorithm>
#include <string>

#include "common/logging.h"
#include "common/stall.h"
#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/wire/kv_payload.h"
#include "pskv/error.h"

namespace pskv::dist {

payload::RoundStatus JoinRoundStatus(const std::vector<std::string>& replies) {
  payload::RoundStatus all;
  for (const auto& body : replies) {
    if (body.empty()) continue;
    payload::RoundStatus s = payload::DecodeRoundStatus(body);
    for (auto& d : s.deadlocks) all.deadlocks.push_back(std::move(d));
    for (auto& l : s.lines) all.lines.push_back(std::move(l));
  }
  return all;
}

namespace {

// Logs (or, `final`, returns) what this worker waits for: its pending requests and
// the servers' open sync rounds. Returns "" when logging. Throws TimeoutError when a
// server reports a round of a key this wait covers (`keys`, null = all) as waiting
// for a worker that is in Barrier(): this worker is blocked on it, so that barrier
// can never complete.
std::string Stalled(ServerLink& link, bool final, std::chrono::seconds waited,
                    const std::vector<int>* keys) {
  KVWorker* worker = link.worker();
  const Options& o = link.options();
  std::string text, deadlock;
  for (auto& l : worker->DescribePending(std::chrono::milliseconds(0))) text += l + "; ";
  try {
    auto status = worker->Command(
        kRoundStatus, "",
        std::min<std::chrono::milliseconds>(o.op_timeout, std::chrono::seconds(10)));
    const payload::RoundStatus s = JoinRoundStatus(status);
    for (auto& d : s.deadlocks) {
      // Only rounds of the keys this wait covers (this worker is blocked on them).
      const bool covered =
          !keys || (StoreOf(d.key) == link.store_id() &&
                    std::find(keys->begin(), keys->end(), KeyOf(d.key)) != keys->end());
      if (covered && deadlock.empty()) deadlock = d.message;
    }
    for (auto& line : s.lines) text += line + "; ";
  } catch (const std::exception& e) {
    text += std::string("(no round status from the servers: ") + e.what() + ")";
  }
  if (!deadlock.empty()) {
    const std::string what = link.node()->Tag() + " waited " + std::to_string(waited.count()) +
                             " s in Wait: deadlock: " + deadlock;
    PSKV_ERROR(what);
    link.MarkBroken(what);
    throw TimeoutError(what);
  }
  if (final) return text.empty() ? "nothing pending on the servers" : "pending: " + text;
  PSKV_WARN("waited " << waited.count() << " s: " << (text.empty() ? "(nothing pending)" : text));
  return {};
}

}  // namespace

void WaitWithStallReports(Engine& engine, ServerLink& link, const std::vector<int>* keys,
                          std::chrono::milliseconds timeout) {
  using namespace std::chrono;
  const auto start = steady_clock::now();
  StatusWait status(&link.node()->status());
  bool idle;
  if (timeout.count() <= 0) {
    idle = engine.WaitIdle(keys, milliseconds(0));  // look once
  } else {
    WaitPlan plan;
    plan.timeout = timeout;
    plan.stall = link.options().stall_warning;
    idle = WaitReporting(
        plan,
        [&](steady_clock::time_point until) {
          const auto left = duration_cast<milliseconds>(until - steady_clock::now());
          return engine.WaitIdle(keys, std::max(left, milliseconds(0)));
        },
        [&](milliseconds waited) {
          status.Report("wait", link.worker()->WaitedServers(), 0, waited);
          try {
            Stalled(link, false, duration_cast<seconds>(waited), keys);
          } catch (const TimeoutError& e) {  // a deadlock
            status.Fail("TimeoutError", e.what());
            throw;
          }
        });
  }
  if (!idle) {
    const std::string what =
        "KVStore wait timed out after " +
        std::to_string(duration_cast<milliseconds>(timeout).count() / 1000.0) +
        " s (raise PSKV_TIMEOUT if this is expected); " +
        Stalled(link, true, duration_cast<seconds>(steady_clock::now() - start), keys);
    link.MarkBroken(what);
    status.Fail("TimeoutError", what);
    throw TimeoutError(what);
  }
  try {
    // Not Wait(keys, 0): another thread may have issued an operation on these keys
    // since they were idle, which a zero-timeout wait would report as a timeout.
    engine.TakeFailure(keys);  // rethrows a recorded failure
  } catch (...) {
    link.MarkBrokenIf(std::current_exception());
    throw;
  }
}

}  // namespace pskv::dist
