// Node: one scheduler, server or worker of a parameter-server job (ps-lite's
// Postoffice + Van, but an ordinary object: several can live in one process).
//
// Lifecycle: Start() binds, registers with the scheduler, receives the node table
// and passes the start-up barrier; Finalize() passes the final barrier and stops.
// Every blocking step has a timeout or ends when a failure is detected.
//
// Identity: every connection is authenticated by the transport (transport/auth.h)
// and bound to the connecting process's random token; a message's sender is the
// node the token belongs to in the node table — the header's sender field must
// agree or the message is dropped. Control messages are accepted only from the
// node entitled to send them (the scheduler's from the scheduler, kLeave from the
// leaving node itself, data between workers and servers only).
//
// Failure detection: every node sends a heartbeat to the scheduler every
// `heartbeat_interval`; the scheduler answers. A node silent for
// `heartbeat_timeout` is declared dead by the scheduler, which tells every other
// node (kNodeFailed); a node that hears nothing from the scheduler for that long
// declares the scheduler dead. A node that exits without Finalize() tells the
// scheduler at once (kLeave). So a dead peer is reported to everyone within
// heartbeat_timeout + heartbeat_interval (default 10 s + 1 s) — faster when the
// process exits rather than hangs.
//
// Send scheduling (PSKV_WIRE_WINDOW_BYTES > 0): big data messages go through a
// per-destination window and priority queue (ps/send_schedule.h); the receiver
// credits them on arrival (kCredit), before any handler runs. Credits travel like
// data (resent and deduplicated with PS_RESEND). Queues are dropped when the job
// fails (their requests fail with the job's error).
//
// Scheduler: on the scheduler's node, the scheduler's role — registration, barrier
// counting, verdicts on failures and the range table's decisions — is a component
// that owns that state (ps/scheduler.h); the Node receives, sends and keeps what
// every node knows (the node table, range table, departed servers).
//
// Standby scheduler (PSKV_SCHEDULER_STANDBY; ps/takeover.h): a second
// scheduler process registers with the scheduler like a node (id kStandbyId, in
// every node's table), follows its range tables and barrier releases, and, when it
// finds the scheduler gone, becomes the scheduler (id kSchedulerId): it tells every
// node (kTakeover), which rebinds "the scheduler" to it, answers with its range table
// (kRejoin) and resends what it waits for (its barrier, spare copies installed).
//
// Components (leveldb's DBImpl is the model: a central class that delegates to parts
// that own their state): Membership (ps/membership.h: the node table, departed
// servers and workers, suspects, the range table — pure bookkeeping), Takeover
// (ps/takeover.h: the standby scheduler's failover, both sides), Barriers
// (ps/barriers.h: this node's barrier waits and the releases it heard), SendPath
// (ps/send_path.h: the sending side and the send schedule with its credits),
// NodeStart (ps/node_start.h: the phases of Start), Scheduler (the scheduler's role),
// Liveness and Resender. Node itself keeps the lifecycle (node.cc; Start in
// node_start.cc), failures and the timer thread (node.cc), receiving and dispatch
// (node_receive.cc), and the handler lists (Events).
//
// Threads: a receive thread (decodes, handles control messages, runs the data
// handler — one message at a time, in arrival order) and a timer thread
// (heartbeats, failure detection, resend). Lock rule: Node's state, and that of its
// Membership, Takeover, Barriers, SendPath and Scheduler, is under mu_ (one lock: a
// message's handling touches several of them at once); Liveness, Resender and
// StatusReporter have their own locks, taken after mu_ (never the other way). The data
// handler and failure callbacks are called without mu_ held, so they may Send.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "common/rate_limit.h"
#include "common/stall.h"
#include "common/status_reporter.h"
#include "protocol/message.h"
#include "ps/barriers.h"
#include "ps/fail_points.h"
#include "ps/link_rate_share.h"
#include "ps/liveness.h"
#include "ps/membership.h"
#include "ps/range_table.h"
#include "ps/resender.h"
#include "ps/send_path.h"
#include "ps/takeover.h"
#include "pskv/options.h"
#include "transport/transport.h"

namespace pskv {

class Scheduler;

/// A node id as status records name it ("worker.1", "server.0", "scheduler.0").
NodeRef NodeRefOf(int id);

class Node {
 public:
  using DataHandler = std::function<void(Message&&)>;
  using FailureHandler = std::function<void(std::exception_ptr)>;
  using RangeTableHandler = std::function<void(const RangeTable&)>;
  using WorkerLeftHandler = std::function<void(int worker_id)>;
  using TransportFactory = std::function<std::unique_ptr<Transport>(const TransportConfig&)>;

  /// `options.role` decides the role; ValidateForDistributed() is checked.
  explicit Node(Options options);
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // --- set before Start()
  void SetTransportFactory(TransportFactory f) { transport_factory_ = std::move(f); }
  /// Runs on the receive thread for every data message; must not block for long
  /// (control messages, e.g. barrier releases, wait behind it).
  void SetDataHandler(DataHandler h) { data_handler_ = std::move(h); }
  void AddFailureHandler(FailureHandler h) { Add(&Events::failure, std::move(h)); }
  /// Runs (on the receive thread, without the node's lock) each time a newer range
  /// table is applied (replicated servers only: docs/fault-tolerance.md).
  void AddRangeTableHandler(RangeTableHandler h) { Add(&Events::range_table, std::move(h)); }
  /// Elastic workers (PSKV_ELASTIC): runs (on the receive thread, without the node's
  /// lock) once for each worker the scheduler dropped from the job.
  void AddWorkerLeftHandler(WorkerLeftHandler h) { Add(&Events::worker_left, std::move(h)); }
  /// Elastic workers: runs (on the receive thread, without the node's lock) once for
  /// each worker that joined the running job in place of one that left (a server
  /// tells the scheduler it is ready for the newcomer's pushes after these ran).
  void AddWorkerJoinedHandler(WorkerLeftHandler h) { Add(&Events::worker_joined, std::move(h)); }

  /// Registers and passes the start-up barrier. Throws TimeoutError (what is
  /// missing), NodeFailure, ProtocolError (refused) or IOError.
  void Start();
  /// Final barrier over all nodes ("this node is done"), then stops. With failure
  /// detection on (the default), it waits for the rest of the job however long
  /// it takes — a worker that finishes early is not a failure — and returns as
  /// soon as the job ends or fails; `timeout` bounds the wait only when failure
  /// detection is off (0 = no bound). If it does time out, the scheduler is told
  /// why (kLeave), so the job fails with that reason instead of a "dead" node.
  /// Throws the job's failure, if any; threads and sockets are released anyway.
  void Finalize(std::chrono::milliseconds timeout);
  /// Stops at once without the final barrier; tells the scheduler `reason` so the
  /// job fails fast instead of waiting for heartbeats to time out.
  void Abort(const std::string& reason);

  /// Blocks until every member of `group` (kWorkerGroup, kServerGroup, kAllGroup,
  /// ...) called Barrier with it. Throws NodeFailure / TimeoutError.
  void Barrier(int group, std::chrono::milliseconds timeout) {
    barriers_.Wait(group, timeout, /*final=*/false);
  }

  /// Sends a data message; sender, recver, job and seq are filled in. Throws the
  /// job's failure if one was detected.
  void Send(int to, Message m) { send_.Data(to, std::move(m)); }

  /// This process acts as the job's scheduler: the scheduler, or a standby that took
  /// over (a standby before that acts as a node following the scheduler).
  bool IsScheduler() const { return options_.role == Role::kScheduler && !standby_.load(); }
  int id() const { return id_; }
  int rank() const { return rank_; }
  Role role() const { return options_.role; }
  int num_workers() const { return options_.num_workers; }
  int num_servers() const { return options_.num_servers; }
  /// The servers that hold the job's key ranges at the start (DMLC_NUM_SERVER of
  /// them; key placement counts these).
  std::vector<int> ServerIds() const { return members_.ServerIds(); }
  /// Every server process: ServerIds() and the spares (PSKV_SPARE_SERVERS).
  std::vector<int> AllServerIds() const { return members_.AllServerIds(); }
  int num_server_processes() const { return options_.num_servers + options_.spare_servers; }
  /// The server processes still in the job (spares included), less those whose
  /// death the range table survived.
  std::vector<int> LiveServerIds() const { return Locked(&Membership::LiveServerIds); }
  /// A spare server: it installed the copy of key range `range` that node `from`
  /// (the range's primary) sent, `bytes` in all; tells the scheduler, which then
  /// lists it as the range's replica (docs/fault-tolerance.md, "Back to full strength").
  void ReportRangeCopied(int range, int from, uint64_t bytes);
  /// The current range table; empty when PSKV_REPLICAS is 0 (or there is one server).
  RangeTable range_table() const { return Locked(&Membership::ranges); }
  /// The current primary of key range `range` (-1 if there is no such range) and the
  /// version of the range table that says so.
  std::pair<int, uint64_t> RangePrimary(int range) const {
    return Locked(&Membership::RangePrimary, range);
  }
  /// True when servers replicate their ranges, so a server's death is survived.
  bool replicated() const { return members_.replicated(); }
  /// Replicated: true if server `id` is known to be gone — the range table removed it,
  /// or this node lost it (FailNode: its connection closed, or silence) and waits for
  /// the scheduler's verdict. A failed send to such a server is expected (the next
  /// range table routes around it); one to any other node is an error.
  bool ServerLost(int id) const { return Locked(&Membership::ServerLost, id); }
  std::vector<int> WorkerIds() const { return members_.WorkerIds(); }
  /// The workers still in the job: WorkerIds() less those an elastic job dropped
  /// (PSKV_ELASTIC; docs/fault-tolerance.md, "Elastic workers").
  std::vector<int> LiveWorkerIds() const { return Locked(&Membership::LiveWorkerIds); }
  /// The workers in the job when the scheduler released this node's last barrier of
  /// `group` (the scheduler's kWorkerLeft notices reach every node before that release:
  /// the same list on every node). Empty before the first release.
  std::vector<int> LiveWorkersAtRelease(int group) const {
    return barriers_.LiveWorkersAtRelease(group);
  }
  /// The barriers of `group` the scheduler released so far (as this node heard).
  uint64_t BarriersReleased(int group) const { return barriers_.Released(group); }
  /// Elastic workers: this worker joined a running job (in place of one that left)
  /// instead of starting with it; its Start returned at the release of the epoch
  /// barrier (kEpochGroup) that admitted it. Set before Start returns.
  bool joined() const { return joined_; }
  const Options& options() const { return options_; }
  /// The link rate this node learned and the job's, shared through the heartbeats
  /// (ps/link_rate_share.h; kvstore/distributed/link_pacing.h).
  LinkRateShare& link_rates() { return link_rates_; }
  /// Where tests disturb this node (ps/fail_points.h): the process's installed
  /// FailPoints, else the no-op one; set_fail_points (before Start) for a node made in
  /// a test.
  FailPoints& fail_points() const { return *fail_points_; }
  void set_fail_points(std::unique_ptr<FailPoints> f) { fail_points_ = std::move(f); }
  /// The address node `id` advertised (its host in the node table, the same on
  /// every node once started); "" if unknown.
  std::string HostOf(int id) const { return Locked(&Membership::HostOf, id); }
  /// Caps the rate of this node's data to node `id` (Transport::SetPacingRate;
  /// after Start, once the node table connected it).
  void SetPacingRate(int id, uint64_t bytes_per_s);
  /// The kernel's counters of the direct TCP connection carrying this node's data to
  /// node `id` (Transport::SendStats); false where there is none.
  bool SendStats(int id, TcpSendStats* out);
  /// The data path carrying this node's messages to node `id` now: "shm", "tcp"
  /// (direct) or "zmq" (benchmarks and tests check which one they measure).
  std::string DataPathTo(int id);
  /// "worker[1] at 127.0.0.1:4321" for any node id of the job.
  std::string NodeName(int id) const { return Locked(&Membership::Name, id); }
  /// This node's name ("server[0]"), for log lines.
  std::string Tag() const;
  /// The failure that broke the job (null while healthy).
  std::exception_ptr failure() const;
  /// This node's status records for its launcher (PSKV_STATUS; common/status_reporter.h):
  /// the node reports its phases; waits that stall report through it.
  StatusReporter& status() { return status_; }

 private:
  using Clock = std::chrono::steady_clock;
  void ReceiveLoop();
  void TimerLoop();
  void Handle(Message&& m, uint64_t token);
  /// mu_ held: binds a message with control `c` from connection `token` to its sender
  /// (`*sender`: the token's node id, 0 if none; the scheduler before the node
  /// table). Null, or why the message is dropped.
  const char* BindSender(Control c, uint64_t token, int header_sender, int* sender);
  /// Why `sender` may not send control `c` with header head `head` (null: it may).
  const char* Unentitled(Control c, int sender, int head) const;
  /// mu_ held: a sequenced message (PS_RESEND): acknowledged, de-duplicated, held
  /// until the gap before it is filled, then dispatched with those it released.
  void DispatchInOrder(Message&& m, int sender, bool scheduled, std::unique_lock<std::mutex>& lk);
  /// Acts on a message from `sender` that passed every check, in order. Called
  /// with `lk` (on mu_) held; may release it.
  void Dispatch(Message&& m, int sender, std::unique_lock<std::mutex>& lk);
  /// The node id bound to connection identity `token`, or 0 (unknown). mu_ held.
  int IdOfToken(uint64_t token) const;
  void HandleNodeTable(const Message& m);
  /// A Membership query `f(args...)` under mu_ (Node's public queries).
  template <typename F, typename... A>
  auto Locked(F f, A... args) const
      -> std::decay_t<std::invoke_result_t<F, const Membership&, A...>> {
    std::lock_guard<std::mutex> lk(mu_);
    return (members_.*f)(args...);
  }
  /// mu_ held: a control message (SendPath; the name the Scheduler and Takeover use).
  void SendControl(int to, Control c, int head = 0, std::string body = {}, uint64_t ts = 0) {
    send_.SendControl(to, c, head, std::move(body), ts);
  }
  /// What follows a peer ForgetPeer forgets. kGone: it left the job (died, was dropped
  /// or removed) and may still run (frozen, cut off), under its own connection: the
  /// sequence numbers (PS_RESEND) with it are kept, as they are still the numbering of
  /// that process. kReplaced: another process takes its id from now on (a worker joining
  /// in a dead one's place, a fresh standby, a standby that took over): the numbering
  /// starts afresh both ways, as the newcomer's does — with the old numbers it would hold
  /// what this node sends behind a gap that never fills, and this node would drop what
  /// it sends as duplicates. (What the old process still sends comes on its own
  /// connection, whose token no longer names the id: dropped before any numbering.)
  enum class Forgotten { kGone, kReplaced };
  /// mu_ held: forgets peer `id` — it left the job, or another process takes its id
  /// from now on (`what`): the messages held for a gap in its sequence, its send queue
  /// and window, whether it is alive and what awaits its acknowledgement (Liveness and
  /// Resender take their own locks after mu_, as the lock rule allows). One that
  /// watches the newcomer in its place calls Liveness::Watch after.
  void ForgetPeer(int id, Forgotten what) {
    held_.erase(id);
    send_.Forget(id);
    liveness_.Forget(id);
    if (what == Forgotten::kReplaced)
      resender_.Reset(id);
    else
      resender_.Forget(id);
  }
  /// `culprit`: the node id the failure blames (a dead peer), 0 if none.
  void Fail(std::exception_ptr e, int culprit = 0);
  void FailNode(int dead_id, const std::string& reason);
  /// A kRangeTable from the scheduler.
  void HandleRangeTable(const Message& m, std::unique_lock<std::mutex>& lk);
  /// Replicated, not the scheduler: fails this node when a server it found gone has
  /// not left the range table within the heartbeat bound (timer thread).
  void CheckSuspects(Clock::time_point now);
  /// A kWorkerLeft from the scheduler: worker `id` is out of the job (elastic).
  void HandleWorkerLeft(int id, std::unique_lock<std::mutex>& lk);
  /// A kWorkerJoined from the scheduler: a worker joined the running job (elastic).
  void HandleWorkerJoined(const Message& m, std::unique_lock<std::mutex>& lk);
  /// mu_ held, the scheduler: sends the job's link rate `a` to `to` (0: nobody) and,
  /// where it is new, to every node whose estimate counts (ps/link_rate_share.h).
  void TellLinkRate(int to, const LinkRateShare::Answer& a);
  // Membership under mu_ held (also the Scheduler's).
  int GroupSize(int group) const { return members_.GroupSize(group); }
  std::vector<int> GroupMembers(int group) const { return members_.GroupMembers(group); }
  std::string NameLocked(int id) const { return members_.Name(id); }
  void StopThreads(std::chrono::milliseconds linger);

  Options options_;
  uint64_t job_ = 0;
  uint64_t token_ = 0;
  std::string host_;
  int port_ = 0;
  int id_ = 0;
  // Set once by registration; read by Tag() from any thread (the log name of the
  // node's threads, common/logging.h LogScope).
  std::atomic<int> rank_{-1};

  TransportFactory transport_factory_;
  std::unique_ptr<Transport> transport_;
  DataHandler data_handler_;

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  // Who hears of what (the Add*Handler lists; under mu_, copied before they run).
  struct Events {
    std::vector<FailureHandler> failure;
    std::vector<RangeTableHandler> range_table;
    // Elastic workers (PSKV_ELASTIC): who hears of a worker that left or joined.
    std::vector<WorkerLeftHandler> worker_left, worker_joined;
  } events_;
  template <typename H>
  void Add(std::vector<H> Events::*list, H h) {
    std::lock_guard<std::mutex> lk(mu_);
    (events_.*list).push_back(std::move(h));
  }
  // Who is in the job (under mu_): the node table, departed servers and workers,
  // suspects, the range table.
  Membership members_{options_};
  // A worker whose registration the scheduler took as a join of the running job
  // (kHeartbeat head 1: it waits for the next epoch barrier), and one admitted so.
  bool join_pending_ = false;
  std::atomic<bool> joined_{false};
  std::exception_ptr failure_;
  uint64_t scheduler_token_ = 0;  // the identity the node table came from
  bool ready_ = false;
  bool scheduler_seen_ = false;
  std::string refused_;
  Clock::time_point start_time_;
  std::unique_ptr<FailPoints> fail_points_;  // never null
  // The scheduler's role (registration, barrier counting, verdicts on failures; under
  // mu_): only on the scheduler's node.
  std::unique_ptr<Scheduler> scheduler_;
  // liveness and resend (own locks)
  Liveness liveness_;
  Resender resender_;
  LinkRateShare link_rates_;  // the scheduler's table under mu_
  StatusReporter status_;     // own lock, taken after mu_ (never the other way)
  bool finished_ = false;     // final barrier passed: no more failure detection
  // Messages received after a gap in a sender's sequence, until it is filled
  // (at most Resender::kMaxHeld per sender).
  std::map<int, std::map<uint64_t, Message>> held_;
  RateLimiter limiter_;                               // warnings about what peers sent
  SendPath send_{*this, options_.wire_window_bytes};  // sending, send scheduling (under mu_)

  // Standby scheduler. standby_: this process is a standby that has not taken over.
  std::atomic<bool> standby_{false};
  Takeover takeover_{*this};  // its failover, both sides (under mu_)
  Barriers barriers_{*this};  // this node's barrier waits (under mu_)
  // What this spare server reported installed (range, from, bytes): resent after a
  // takeover (at most one per range: bounded).
  std::map<int, std::pair<uint64_t, uint64_t>> copies_reported_;
  std::atomic<bool> stop_{false};
  bool started_ = false, stopped_ = false;
  std::thread recv_thread_, timer_thread_;

  friend class Scheduler;       // its component: uses the plumbing and the shared tables
  friend class ElasticWorkers;  // the scheduler's component: seats joining workers
  friend class Takeover;        // its component: acts through the plumbing
  friend class Barriers;        // its component: acts through the plumbing
  friend class SendPath;        // its component: acts through the plumbing
  friend class NodeStart;       // the phases of Start
};

}  // namespace pskv
