// ServerLosses: whether a job goes on when one of its server processes dies.
//
// Without replicated servers, any process that exits non-zero ends the job. With
// them (PSKV_REPLICAS >= 1, docs/fault-tolerance.md, "The launcher") a server's death
// is survived as long as every key range keeps a live copy, and only the scheduler
// knows that (its range table). The launcher learns its verdict from the scheduler's
// status records (common/status_record.h), never from log text:
//
//  * the scheduler's records say the job replicates (`replicas` > 0) and within how
//    long it declares a dead node dead (`detect_ms` > 0); without both, a server's
//    death ends the job at once, as any other process's;
//  * a dead server child (every node it reported is a server with a rank) is then
//    pending: it is survived when the scheduler lists all its nodes as `departed`;
//    the job fails when the scheduler reports `failed` (its message names the key
//    ranges lost), when the scheduler exits, or when no verdict came within
//    `detect_ms` + kVerdictSlack of the death;
//  * a child still running whose nodes the scheduler declared departed (silent,
//    partitioned, frozen) is out of the job: the launcher stops it, so that nothing
//    of it is left running at the end.
// A worker's death is survivable only with elastic workers (set_elastic_workers:
// PSKV_ELASTIC), decided the same way (the scheduler lists it departed, or fails the
// job below PSKV_MIN_WORKERS). The scheduler's death, or a server's before it reported
// a rank, is never survivable while the job runs. After the job's end (AfterEnd), with or
// without replication, a server's or the scheduler's death fails nothing: the
// scheduler released every node from the final barrier, no worker needs a server any
// more, and the workers' own code after close() is left to finish. Pure (no I/O):
// the caller says which children are alive and acts on the verdicts.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "launcher/status_board.h"

namespace pskv::launcher {

class ServerLosses {
 public:
  using Clock = std::chrono::steady_clock;
  /// How much longer than the scheduler's own detection bound the launcher waits.
  static constexpr std::chrono::milliseconds kVerdictSlack{5000};

  /// True when child `child` died after the job's end: the scheduler reported itself
  /// finished (every node passed the final barrier, and its releases were
  /// acknowledged) and every node the child reported is a server or the scheduler. Its
  /// death, whatever its status, is then no failure of the job. A worker's never is
  /// (its own code after close() failed).
  static bool AfterEnd(size_t child, const StatusBoard& board);

  /// Child `child` exited unexpectedly at `now`; `how` describes it ("server 1 (pid
  /// 42) was killed by signal 9 (Killed)"). True if the job may survive it: its
  /// verdict is then pending (Decide). False: the death ends the job.
  bool Died(size_t child, std::string how, int status, const StatusBoard& board,
            const std::vector<bool>& alive, Clock::time_point now);

  struct Verdict {
    bool survived = false;
    bool after_end = false;  ///< survived: it died after the job's end (see AfterEnd)
    size_t child = 0;
    int status = 0;       ///< the dead child's exit status
    std::string message;  ///< what the launcher says about it
  };
  /// The pending deaths decided by `now` (each once), in order of death.
  std::vector<Verdict> Decide(const StatusBoard& board, const std::vector<bool>& alive,
                              Clock::time_point now);
  /// Running children (of `alive`) whose every node the scheduler declared departed.
  std::vector<size_t> Departed(const StatusBoard& board, const std::vector<bool>& alive) const;

  bool pending() const { return !pending_.empty(); }

  /// Elastic workers (PSKV_ELASTIC): a dead worker child is pending too, survived when
  /// the scheduler lists it departed (it dropped the worker from the job).
  void set_elastic_workers(bool on) { elastic_workers_ = on; }
  /// True if every node child `child` reported is a worker.
  static bool IsWorker(size_t child, const StatusBoard& board);

 private:
  struct Pending {
    size_t child;
    std::vector<NodeRef> nodes;
    std::string how;
    int status;
    Clock::time_point deadline;
    std::chrono::milliseconds waited;
  };
  std::vector<Pending> pending_;
  bool elastic_workers_ = false;
};

}  // namespace pskv::launcher
