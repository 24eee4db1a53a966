// Options: every tunable of pskv in one plain struct.
//
// `Options::FromEnv()` reads the environment, driven by one table of every variable
// (name, type, range, default, job-wide or per process, doc: src/common/env_table.cc,
// shown in the README). Everything else takes an Options value explicitly, so several
// nodes (scheduler, servers, workers) can live in one test process with different
// options. (pskv-launch reads the same table to forward job-wide variables.)
//
// MXNet's and ps-lite's variable names are kept (DMLC_*, PS_*, MXNET_KVSTORE_*);
// pskv's own additions are prefixed PSKV_. A malformed value (e.g. DMLC_NUM_WORKER=two)
// is a ConfigError naming the variable — never silently a default.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace pskv {

enum class Role { kWorker, kServer, kScheduler };
std::string RoleName(Role r);

struct Options {
  // ---- single-machine reduction ----
  /// MXNET_KVSTORE_BIGARRAY_BOUND: arrays with at least this many elements are
  /// reduced with several threads and, in dist mode, sliced over all servers.
  int64_t bigarray_bound = 1000000;
  /// MXNET_KVSTORE_REDUCTION_NTHREADS: threads used to reduce big arrays.
  int reduction_threads = 4;
  /// PSKV_SERVER_THREADS: threads a dist server merges, updates and replies with
  /// (its keys are sharded over them; the node's receive thread only dispatches).
  /// 0 (default): the cores of this machine, at most 8 (pskv-launch's local mode
  /// sets each server's share of the cores: cores / processes it starts, at least 1).
  int server_threads = 0;
  /// PSKV_FUSION_KEY_BYTES: in one Push/Pull/PushPull call of a dist store, the keys
  /// of at most this many bytes (held whole by one server, not compressed) that live
  /// on the same server travel together in fused messages; 0 disables fusion.
  int64_t fusion_key_bytes = 65536;
  /// PSKV_FUSION_BYTES: the most value bytes one fused message carries.
  int64_t fusion_bytes = 1 << 20;
  /// PSKV_INLINE_START_BYTES: a dist store's Push/Pull/PushPull of one key with at
  /// most this many value bytes (one value, not compressed; any Pull) starts on the
  /// calling thread when no other operation is waiting to start, instead of waking
  /// the engine's thread (one thread hand-off less per small operation); 0: never.
  int64_t inline_start_bytes = 65536;
  /// PSKV_SPIN_US: before sleeping, a node's receive thread (if a message of at
  /// most 64 KiB came within 20x this) and a caller waiting in a dist store's Wait
  /// look again without sleeping for up to this long, giving the core to any other
  /// runnable thread between looks: a thread that sleeps costs a wake-up per hop,
  /// tens of µs where an idle core halts (docs/performance.md, item 7). An idle
  /// process does not spin. 0: never spin.
  int64_t spin_us = 100;
  /// PSKV_SERVER_WEIGHTS: how much of each big dense key (at least bigarray_bound
  /// elements) every server holds. "auto" (default): shares that balance the bytes on
  /// the hosts' links, from where the node table says the nodes run — a server on a
  /// host with workers gets less than one on a host of its own, whose link carries no
  /// worker's traffic (docs/performance.md, "Across hosts"); even when all nodes share
  /// one host or the layout is symmetric. "even": every server the same. Or one
  /// whole-number weight per server rank, "1,1,3,3" (0: none of the big keys).
  /// Every worker must agree (the workers name which elements each server holds).
  std::string server_weights = "auto";
  /// PSKV_WIRE_CHUNK_BYTES: a dense key's slice on a server bigger than this is
  /// cut into chunks of about this many bytes, each its own ps key and message, so
  /// that a more urgent key's messages can overtake it between chunks (the servers
  /// merge and update each chunk on its own). 0: off (one message per server).
  /// Workers and servers of a job must agree (keys are named by their chunks).
  int64_t wire_chunk_bytes = int64_t{256} << 10;
  /// PSKV_WIRE_WINDOW_BYTES: per destination, the value bytes of big messages
  /// (at least 64 KiB each) a node has sent that the receiver has not yet
  /// acknowledged receiving; more wait in a queue ordered by priority (higher
  /// first, then in order). Smaller messages go at once. 0: off (FIFO as sent).
  int64_t wire_window_bytes = int64_t{512} << 10;
  /// PSKV_WIRE_AHEAD_BYTES: per server, the bytes of one key's pushed pieces a
  /// worker has sent that the server has not answered yet; the next pieces wait
  /// for answers (a worker runs at most this far ahead of the slowest one on each
  /// server; docs/design.md, "Priorities on the wire"). 0: off (all at once).
  int64_t wire_ahead_bytes = int64_t{512} << 10;
  /// PSKV_LINK_RATE: bytes per second of each host's link (> 0): the kernel paces
  /// every connection between a worker and a server on another host at this rate
  /// times the server's share over the busiest link's load, so that no link queues
  /// (kvstore/distributed/link_pacing.h; docs/performance.md, "Across hosts"); pushes are
  /// then not held back by wire_ahead_bytes. < 0 (default; PSKV_LINK_RATE=1): learned
  /// while the job runs, where its nodes are on more than one host; 0: off.
  int64_t link_rate = -1;
  /// PSKV_REPLICAS: besides its primary, this many other servers hold a copy of each
  /// server's key range (docs/fault-tolerance.md); at most num_servers - 1 are used.
  /// 0 (default): a dead server ends the job. All nodes of a job must agree.
  int replicas = 0;
  /// PSKV_SPARE_SERVERS: server processes besides DMLC_NUM_SERVER that hold no key
  /// range until a server dies; then one copies the ranges left with fewer than
  /// `replicas` copies and becomes their replica (docs/fault-tolerance.md, "Back to
  /// full strength"). Key placement counts only DMLC_NUM_SERVER. All nodes must agree.
  int spare_servers = 0;
  /// PSKV_SPARE_SERVER: this server process is one of the spares.
  bool spare = false;
  /// PSKV_SCHEDULER_STANDBY: "host:port" of a standby scheduler that takes over when
  /// the scheduler dies (docs/fault-tolerance.md, "The scheduler"); "" = none. All
  /// nodes must agree: the scheduler waits for the standby to register.
  std::string standby_scheduler;
  /// PSKV_STANDBY: this scheduler process is the standby (it binds at
  /// standby_scheduler and follows the scheduler at DMLC_PS_ROOT_URI:PORT).
  bool standby = false;
  /// PSKV_HELD_REQUEST_BYTES: with replicas, the most bytes of one worker's requests a
  /// server keeps for key ranges it holds but does not lead yet (held until the range
  /// table that promotes it arrives; docs/fault-tolerance.md, "Promotion on the
  /// servers"); each request counts at least 1 KiB. Past it a request is refused with
  /// an error saying so (docs/security.md, "Replicated servers").
  int64_t held_request_bytes = int64_t{1} << 30;
  /// PSKV_ELASTIC: a worker that dies is dropped from the job instead of ending it
  /// (docs/fault-tolerance.md, "Elastic workers"): the sync rounds it did not push
  /// close with the pushes that arrived, their sum scaled by num_workers /
  /// contributors. false (default): MXNet's strict rounds. All nodes must agree.
  bool elastic = false;
  /// PSKV_MIN_WORKERS: elastic, the job fails when fewer workers are left.
  int min_workers = 1;

  // ---- parameter-server contract (ps-lite's DMLC_* variables) ----
  /// DMLC_ROLE. `role_set` is false when the variable is absent.
  Role role = Role::kWorker;
  bool role_set = false;
  std::string root_uri;   ///< DMLC_PS_ROOT_URI: scheduler host
  int root_port = 0;      ///< DMLC_PS_ROOT_PORT
  int num_servers = 0;    ///< DMLC_NUM_SERVER
  int num_workers = 0;    ///< DMLC_NUM_WORKER
  std::string interface;  ///< DMLC_INTERFACE: NIC whose IPv4 address is advertised
  std::string node_host;  ///< DMLC_NODE_HOST: address to advertise and bind
  int port = 0;           ///< PORT: this node's port (0 = any free port)
  /// DMLC_TASK_ID (set by launchers): orders ranks within a role; -1 = by address.
  int64_t rank_hint = -1;
  int verbose = 0;      ///< PS_VERBOSE: 1 connections/registration, 2 every message
  bool resend = false;  ///< PS_RESEND: acknowledge and retransmit messages
  std::chrono::milliseconds resend_timeout{1000};      ///< PS_RESEND_TIMEOUT (ms)
  std::chrono::milliseconds heartbeat_interval{1000};  ///< PS_HEARTBEAT_INTERVAL (s)
  /// PS_HEARTBEAT_TIMEOUT (s): a node silent this long is declared dead. 0 disables
  /// failure detection (not recommended: a dead node then makes peers wait until
  /// their operation timeouts).
  std::chrono::milliseconds heartbeat_timeout{10000};
  /// PSKV_REGISTER_TIMEOUT (s): how long start-up waits for all nodes to register.
  std::chrono::milliseconds register_timeout{60000};
  /// PSKV_TIMEOUT (s): default timeout of blocking calls (Wait, Barrier, commands).
  std::chrono::milliseconds op_timeout{600000};
  /// PSKV_JOB_ID: identifies the job; nodes with another id are refused. The
  /// launcher sets a random one; otherwise the scheduler address is used.
  std::string job_id;
  /// PSKV_JOB_SECRET, or the contents of the file named by PSKV_JOB_SECRET_FILE
  /// (which must not be readable by group or others): the per-job secret every
  /// node proves it knows when it connects (docs/security.md). pskv-launch
  /// generates one per job. Empty: open mode (MXNet's behaviour: anyone who can
  /// reach the ports can join), announced once with a warning. At least
  /// kMinSecretLength characters (a ConfigError otherwise).
  std::string job_secret;
  static constexpr size_t kMinSecretLength = 16;
  /// PSKV_ENCRYPT=1: encrypt and authenticate every byte (ZeroMQ CURVE keyed from
  /// the job secret; needs a secret). For networks where others can see traffic.
  bool encrypt = false;
  /// PSKV_SHM: shared memory between the nodes of one host (docs/transport.md).
  /// "auto" (default): with peers whose address is one of this host's; "1": offered
  /// to every peer (those on other hosts decline it); "0": TCP only.
  std::string shm = "auto";
  /// PSKV_SHM_RING_BYTES: size of each shared-memory ring (one per direction and
  /// pair of co-located nodes), a power of two between 4 KiB and 1 GiB.
  int64_t shm_ring_bytes = int64_t{8} << 20;
  /// PSKV_TCP_DIRECT: "1": messages to nodes that share no memory with this one go
  /// over a direct TCP connection written and read by pskv's own threads
  /// (negotiated over the authenticated ZeroMQ connection; not in encrypted mode,
  /// not with the scheduler): small operations ~2x faster (default). "0": through
  /// ZeroMQ (where only fixed ports are open; docs/transport.md, "Direct TCP").
  bool tcp_direct = true;
  /// PSKV_MAX_CONNECTIONS: connections a node accepts that have not finished
  /// authenticating, at most; beyond that the oldest are closed, and one source
  /// address may hold only a quarter of them (0 = 4 * nodes + 64).
  int max_pending_connections = 0;
  /// PSKV_HANDSHAKE_TIMEOUT (s): a connection that has not authenticated within
  /// this time is closed.
  std::chrono::milliseconds handshake_timeout{10000};
  /// PSKV_TIMELINE: write a Chrome trace of every push/pull/pushpull per key to this
  /// path (".<role>.<pid>" is inserted before the extension: one file per process).
  std::string timeline_path;
  /// PSKV_METRICS_PORT: serve per-key and per-peer counters as Prometheus text on
  /// this port (or the next free one; each process logs its URL). 0: off.
  int metrics_port = 0;
  /// PSKV_METRICS_HOST: the address the metrics endpoint binds. It is not
  /// authenticated, so by default only this host can read it; 0.0.0.0 serves
  /// every interface (for a Prometheus elsewhere; the job's names and sizes show).
  std::string metrics_host = "127.0.0.1";
  /// PSKV_LOG_LEVEL: log levels, "warn" or per module "warn,ps=info,kvstore=debug"
  /// (modules: ps, kvstore, transport, common, launcher). Empty: info everywhere.
  std::string log_levels;
  /// PSKV_METRICS_FILE: write the same counters to this file at exit (".<role>.<pid>"
  /// inserted as for the timeline).
  std::string metrics_file;
  /// PSKV_STATUS: where the node writes its status records for its launcher ("fd:N":
  /// a socket pskv-launch passed down; "stderr": tagged lines among the output;
  /// "": none). Set by pskv-launch; docs/design.md, "Status channel".
  std::string status_channel;

  // ---- round integrity and stall inspection (dist stores) ----
  /// PSKV_STRICT_ROUNDS (0/1): in dist_sync, a worker's per-key calls must form
  /// rounds "push (or push-pull), then pulls of that round": a pull of a key this
  /// worker has already pulled since its last push of it, or a second push without
  /// a pull in between, is a UsageError at the call naming the key and the round.
  /// Pulls before a key's first push (its init value) are always allowed.
  bool strict_rounds = false;
  /// PSKV_STALL_WARNING (s): a barrier, sync round, command or wait that has waited
  /// this long logs what it waits for (which nodes), again after 2x, 4x, ...; a
  /// worker whose wait stalled this long on a sync round that needs a push from a
  /// worker in Barrier() fails the wait with TimeoutError naming both (a deadlock).
  /// 0 disables the reports and the deadlock check.
  std::chrono::milliseconds stall_warning{60000};
  /// PSKV_SUM_ORDER ("rank" or "arrival"): how a dist_sync server sums a round's
  /// pushes. "rank" (default) sums in worker-rank order once the round is complete,
  /// so results are bit-identical from run to run; "arrival" adds each push as it
  /// arrives (overlaps the additions with the wait for slower workers).
  bool sum_in_arrival_order = false;
  /// MXNET_UPDATE_ON_KVSTORE (0/1): whether a Trainer (C++ or Python) given this
  /// store and no `update_on_kvstore` lets the store run the optimizer; unset: true.
  /// The rest of the policy: ResolveUpdateOnKVStore (pskv/trainer_policy.h).
  std::optional<bool> update_on_kvstore;

  /// Reads every variable above from the environment on top of the defaults.
  /// Throws ConfigError naming the variable when a value is malformed.
  static Options FromEnv();
  /// Checks that the fields a distributed node needs are present and sane
  /// (root_uri, root_port, num_servers, num_workers); throws ConfigError naming
  /// the DMLC_* variable to set.
  void ValidateForDistributed() const;
};

}  // namespace pskv
