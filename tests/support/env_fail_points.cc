#include "support/env_fail_points.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ps/node.h"
#include "pskv/error.h"

namespace pskv::test {

namespace {

using Clock = std::chrono::steady_clock;

struct Settings {
  int64_t reply_delay_ms = 0;
  bool duplicate_replies = false;
  bool bogus_credits = false;
  int64_t copy_hold_changes = 0;
  bool exit_at_start = false;
  int64_t exit_after_replicated_rounds = 0;
  int64_t exit_after_forwarded_inits = 0;
  int64_t exit_before_delegated_answer = 0;
  int64_t hold_replication_round = 0;
  int64_t exit_amid_replication = 0;
  int64_t cut_scheduler_after_ms = 0;
};

// The variable `name` as an integer in [lo, hi] (0 when unset or empty).
int64_t Read(const char* name, int64_t lo, int64_t hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v, &end, 10);
  if (*end || errno || x < lo || x > hi)
    throw ConfigError(std::string("environment variable ") + name + "='" + v +
                      "' is not an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                      "] (tests/support/env_fail_points.h)");
  return x;
}

Settings ReadSettings() {
  constexpr int64_t kBig = 1000000000;
  Settings s;
  s.reply_delay_ms = Read("PSKV_TEST_REPLY_DELAY", 0, 3600000);
  s.duplicate_replies = Read("PSKV_TEST_DUPLICATE_REPLIES", 0, 1) != 0;
  s.bogus_credits = Read("PSKV_TEST_BOGUS_CREDITS", 0, 1) != 0;
  s.copy_hold_changes = Read("PSKV_TEST_COPY_HOLD_CHANGES", 0, 1000000);
  s.exit_at_start = Read("PSKV_TEST_EXIT_AT_START", 0, 1) != 0;
  s.exit_after_replicated_rounds = Read("PSKV_TEST_EXIT_AFTER_REPLICATED_ROUNDS", 0, kBig);
  s.exit_after_forwarded_inits = Read("PSKV_TEST_EXIT_AFTER_FORWARDED_INITS", 0, kBig);
  s.exit_before_delegated_answer = Read("PSKV_TEST_EXIT_BEFORE_DELEGATED_ANSWER", 0, kBig);
  s.hold_replication_round = Read("PSKV_TEST_HOLD_REPLICATION_ROUND", 0, kBig);
  s.exit_amid_replication = Read("PSKV_TEST_EXIT_AMID_REPLICATION", -kBig, kBig);
  s.cut_scheduler_after_ms = Read("PSKV_TEST_CUT_SCHEDULER_AFTER", 0, 3600000);
  return s;
}

class Points : public FailPoints {
 public:
  Points(const Node& node, Settings s) : node_(node), s_(s) {}
  ~Points() override { Quiesce(); }

  WireDisturbance Wire() override {
    WireDisturbance w{s_.duplicate_replies, s_.bogus_credits, {}};
    // A standby (a scheduler that is not the job's scheduler yet): its messages to the
    // scheduler vanish once the cut began; the scheduler's and the nodes' links stay.
    if (s_.cut_scheduler_after_ms > 0 && node_.role() == Role::kScheduler && !node_.IsScheduler())
      w.cut = [at_ = cut_at_](int peer) {  // shared: the transport may outlive this
        const int64_t at = at_->load();
        return peer == kSchedulerId && at > 0 && Clock::now().time_since_epoch().count() >= at;
      };
    return w;
  }
  std::chrono::milliseconds ReplyDelay() override {
    return std::chrono::milliseconds(s_.reply_delay_ms);
  }
  uint64_t CopyHoldChanges() override { return static_cast<uint64_t>(s_.copy_hold_changes); }

  void Registered() override {
    if (s_.cut_scheduler_after_ms > 0 && node_.role() == Role::kScheduler && !node_.IsScheduler()) {
      *cut_at_ = (Clock::now() + std::chrono::milliseconds(s_.cut_scheduler_after_ms))
                     .time_since_epoch()
                     .count();
      Log("cuts its link to the scheduler in " + std::to_string(s_.cut_scheduler_after_ms) +
          " ms (test hook)");
    }
    if (s_.exit_at_start && node_.role() == Role::kServer)
      Exit("exiting before the start barrier (test hook)");
  }
  void RoundReplicated(int range) override {
    if (s_.exit_after_replicated_rounds > 0 &&
        Count(&replicated_, range) >= s_.exit_after_replicated_rounds)
      Exit("exiting after " + std::to_string(s_.exit_after_replicated_rounds) +
           " replicated rounds (test hook)");
  }
  void InitForwarded(int range) override {
    if (s_.exit_after_forwarded_inits > 0 &&
        Count(&forwarded_, range) >= s_.exit_after_forwarded_inits)
      Exit("exiting after " + std::to_string(s_.exit_after_forwarded_inits) +
           " forwarded inits (test hook)");
  }
  void DelegatedRoundAcknowledged(int range, size_t answers) override {
    if (s_.exit_before_delegated_answer <= 0 ||
        Count(&delegated_, range) < s_.exit_before_delegated_answer)
      return;
    // The acknowledgement reaches the primary first, which leaves these answers to
    // this copy: the workers must get them from the primary all the same.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    Exit("exiting before answering " + std::to_string(answers) +
         " push-pull(s) for the primary (test hook)");
  }
  bool HoldReplicatedRound(int range, int64_t round, std::function<uint64_t()> table_version,
                           std::function<void()>& send) override {
    if (s_.hold_replication_round <= 0 || round != s_.hold_replication_round ||
        table_version() != 1)
      return false;
    std::lock_guard<std::mutex> lk(mu_);
    held_.emplace_back(
        [this, range, table_version = std::move(table_version), send = std::move(send)] {
          const auto until = Clock::now() + std::chrono::seconds(10);
          while (table_version() == 1 && Clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          Log("key range " + std::to_string(range) +
              ": a held round sent to the replicas chosen before range table v" +
              std::to_string(table_version()) + " (test hook)");
          send();
        });
    return true;
  }
  void ReplicationFanout(std::vector<int>* to, const char* what) override {
    const int64_t n = s_.exit_amid_replication;
    if (n == 0) return;
    std::lock_guard<std::mutex> lk(mu_);
    if (++fanouts_ != (n > 0 ? n : -n)) return;
    // The others never get it: this process exits first (NarrowedChangeAnswered).
    *to = {n > 0 ? to->front() : to->back()};
    Log("sends replicated change " + std::to_string(n > 0 ? n : -n) + " (" + what + ") to " +
        node_.NodeName(to->front()) + " only (test hook)");
  }
  void NarrowedChangeAnswered(int id) override {
    Exit("exiting amid a replicated change, sent to " + node_.NodeName(id) + " only (test hook)");
  }
  void Quiesce() override {
    std::vector<std::thread> held;
    {
      std::lock_guard<std::mutex> lk(mu_);
      held.swap(held_);
    }
    for (auto& t : held) t.join();
  }

 private:
  int64_t Count(std::map<int, int64_t>* counts, int range) {
    std::lock_guard<std::mutex> lk(mu_);
    return ++(*counts)[range];
  }
  void Log(const std::string& what) {
    std::fprintf(stderr, "%s: %s\n", node_.Tag().c_str(), what.c_str());
  }
  [[noreturn]] void Exit(const std::string& why) {
    Log(why);
    std::_Exit(137);  // as if killed: nothing of this process runs any more
  }

  const Node& node_;
  const Settings s_;
  std::mutex mu_;
  std::map<int, int64_t> replicated_, forwarded_, delegated_;  // by key range
  int64_t fanouts_ = 0;
  // When a standby's link to the scheduler is cut: Clock ticks since its epoch (0: not yet).
  std::shared_ptr<std::atomic<int64_t>> cut_at_ = std::make_shared<std::atomic<int64_t>>(0);
  std::vector<std::thread> held_;
};

}  // namespace

std::unique_ptr<FailPoints> EnvFailPoints(const Node& node) {
  return std::make_unique<Points>(node, ReadSettings());
}

void InstallEnvFailPoints() {
  ReadSettings();
  InstallFailPoints(EnvFailPoints);
}

}  // namespace pskv::test
