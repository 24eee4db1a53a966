// The environment-variable table (env_table.h) and the parsers its entries use.
#include "common/env_table.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string_view>

#include "common/logging.h"
#include "common/status_record.h"
#include "pskv/error.h"

namespace pskv {
namespace {

using std::chrono::milliseconds;

}  // namespace

int64_t EnvInt(const EnvVar& e, const char* v) {
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || x < e.lo || x > e.hi) {
    throw ConfigError(std::string("environment variable ") + e.name + "='" + v +
                      "' is not a whole number in [" + std::to_string(e.lo) + ", " +
                      std::to_string(e.hi) + "]");
  }
  return x;
}

namespace {

// Seconds given as a decimal number (so tests can use 0.5).
milliseconds ParseSeconds(const EnvVar& e, const char* v) {
  errno = 0;
  char* end = nullptr;
  double x = std::strtod(v, &end);
  const double lo = static_cast<double>(e.lo), hi = static_cast<double>(e.hi);
  if (errno != 0 || end == v || *end != '\0' || !(x >= lo && x <= hi)) {
    throw ConfigError(std::string("environment variable ") + e.name + "='" + v +
                      "' is not a number in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                      "]");
  }
  return milliseconds(static_cast<int64_t>(x * 1000));
}

// One of e.choices ("a|b|c"), or a ConfigError listing them.
std::string ParseChoice(const EnvVar& e, const char* v) {
  std::string_view all = e.choices;
  for (size_t at = 0; at <= all.size();) {
    size_t bar = all.find('|', at);
    if (bar == std::string_view::npos) bar = all.size();
    if (all.substr(at, bar - at) == v) return v;
    at = bar + 1;
  }
  std::string list(all);
  for (auto& c : list)
    if (c == '|') c = ',';
  size_t pos = 0;
  while ((pos = list.find(',', pos)) != std::string::npos) list.replace(pos++, 1, ", ");
  throw ConfigError(std::string("environment variable ") + e.name + "='" + v +
                    "' is not one of: " + list);
}

// Generic appliers, one per member type.
template <auto M>
void Int(const EnvVar& e, const char* v, Options& o) {
  using T = std::remove_reference_t<decltype(o.*M)>;
  o.*M = static_cast<T>(EnvInt(e, v));
}
template <auto M>
void Bool(const EnvVar& e, const char* v, Options& o) {
  o.*M = EnvInt(e, v) != 0;
}
template <auto M>
void Seconds(const EnvVar& e, const char* v, Options& o) {
  o.*M = ParseSeconds(e, v);
}
template <auto M>
void Millis(const EnvVar& e, const char* v, Options& o) {
  o.*M = milliseconds(EnvInt(e, v));
}
template <auto M>
void Text(const EnvVar&, const char* v, Options& o) {
  o.*M = v;
}
template <auto M>
void Choice(const EnvVar& e, const char* v, Options& o) {
  o.*M = ParseChoice(e, v);
}

void ApplyRole(const EnvVar& e, const char* v, Options& o) {
  const std::string r = ParseChoice(e, v);
  o.role = r == "server" ? Role::kServer : r == "scheduler" ? Role::kScheduler : Role::kWorker;
  o.role_set = true;
}
// PSKV_LINK_RATE=1 or unset learns the rate (-1); 0: off; above: the stated rate.
void ApplyLinkRate(const EnvVar& e, const char* v, Options& o) {
  const int64_t r = EnvInt(e, v);
  o.link_rate = r == 1 ? -1 : r;
}
void ApplySumOrder(const EnvVar& e, const char* v, Options& o) {
  o.sum_in_arrival_order = ParseChoice(e, v) == "arrival";
}
void ApplySecretFile(const EnvVar&, const char* v, Options& o) {
  if (!o.job_secret.empty())
    throw ConfigError("both PSKV_JOB_SECRET and PSKV_JOB_SECRET_FILE are set: set only one");
  o.job_secret = ReadJobSecretFile(v);
}
void ApplyLogLevel(const EnvVar&, const char* v, Options& o) {
  CheckLogLevels(v);  // ConfigError naming the variable; applied where the node starts
  o.log_levels = v;
}
void ApplyServerWeights(const EnvVar&, const char* v, Options& o) {
  const std::string s = v;
  if (!IsServerWeightsKeyword(s)) ParseServerWeights(s);  // ConfigError if malformed
  o.server_weights = s;
}
void ApplyStatus(const EnvVar&, const char* v, Options& o) {
  StatusChannel::Validate(v);  // ConfigError naming the variable; opened where the node starts
  o.status_channel = v;
}
void ApplyUpdateOnKVStore(const EnvVar& e, const char* v, Options& o) {
  o.update_on_kvstore = EnvInt(e, v) != 0;
}

constexpr int64_t kMaxI64 = INT64_MAX;
constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t kMaxSeconds = 10000000;

using S = EnvScope;
using T = EnvType;

// In the README's order. Keep each doc to one line: the README shows it as is.
const EnvVar kVars[] = {
    // ---- the job (the DMLC_* contract; pskv-launch sets these for each node)
    {"DMLC_ROLE", T::kChoice, 0, 0, "scheduler|server|worker", "—", S::kLauncher,
     "`scheduler`, `server` or `worker`", ApplyRole},
    {"DMLC_PS_ROOT_URI", T::kText, 0, 0, "", "—", S::kLauncher, "the scheduler's address",
     Text<&Options::root_uri>},
    {"DMLC_PS_ROOT_PORT", T::kInt, 1, 65535, "", "—", S::kLauncher, "the scheduler's port",
     Int<&Options::root_port>},
    {"DMLC_NUM_SERVER", T::kInt, 0, 65536, "", "—", S::kLauncher, "servers in the job",
     Int<&Options::num_servers>},
    {"DMLC_NUM_WORKER", T::kInt, 0, 65536, "", "—", S::kLauncher, "workers in the job",
     Int<&Options::num_workers>},
    {"DMLC_TASK_ID", T::kInt, 0, kMaxI64, "", "by address", S::kLauncher,
     "orders the ranks within a role", Int<&Options::rank_hint>},
    {"PSKV_SPARE_SERVERS", T::kInt, 0, 1024, "", "0", S::kLauncher,
     "spare server processes of a job with `PSKV_REPLICAS` (besides `DMLC_NUM_SERVER`, which "
     "they do not change the key placement of): when a server dies, a spare copies its ranges "
     "from their live copies while training goes on and the job is back to full strength "
     "([fault tolerance](docs/fault-tolerance.md#back-to-full-strength)); every node must set "
     "the same",
     Int<&Options::spare_servers>},
    {"PSKV_SPARE_SERVER", T::kBool, 0, 1, "", "0", S::kLauncher,
     "1: this server process (`DMLC_ROLE=server`) is one of the job's `PSKV_SPARE_SERVERS`",
     Bool<&Options::spare>},
    {"PSKV_SCHEDULER_STANDBY", T::kText, 0, 0, "", "none", S::kLauncher,
     "`host:port` of a standby scheduler (a second scheduler process started with "
     "`PSKV_STANDBY=1`) that takes over when the scheduler dies; every node must set the same; "
     "`pskv-launch` sets it by default (not with `--no-standby-scheduler` or kubernetes) "
     "([fault tolerance](docs/fault-tolerance.md#the-scheduler-built))",
     Text<&Options::standby_scheduler>},
    {"PSKV_STANDBY", T::kBool, 0, 1, "", "0", S::kLauncher,
     "1: this scheduler process (`DMLC_ROLE=scheduler`) is the standby, bound at "
     "`PSKV_SCHEDULER_STANDBY`",
     Bool<&Options::standby>},
    {"DMLC_JOB_CLUSTER", T::kText, 0, 0, "", "—", S::kLauncher,
     "the launcher that started the job (`local`, `ssh`, `mpi`, ...; MXNet's name); pskv does "
     "not read it",
     nullptr},
    {"DMLC_INTERFACE", T::kText, 0, 0, "", "first NIC", S::kHost,
     "the NIC whose IPv4 address a node binds and advertises (e.g. `ib0`)",
     Text<&Options::interface>},
    {"DMLC_NODE_HOST", T::kText, 0, 0, "", "first NIC", S::kProcess,
     "the address a node binds and advertises", Text<&Options::node_host>},
    {"PORT", T::kInt, 0, 65535, "", "any port", S::kProcess, "a node's port", Int<&Options::port>},
    // ---- diagnostics
    {"PS_VERBOSE", T::kInt, 0, 3, "", "0", S::kJob,
     "1: connections and registration, 2: every message", Int<&Options::verbose>},
    {"PSKV_LOG_LEVEL", T::kText, 0, 0, "", "info", S::kJob,
     "levels per module: `warn` or `warn,ps=info,launcher=error` (modules `ps`, `kvstore`, "
     "`transport`, `common`, `launcher`; levels `debug`, `info`, `warn`, `error`, `off`); the "
     "launcher reads it too and passes it on",
     ApplyLogLevel},
    {"PSKV_STATUS", T::kText, 0, 0, "", "set by `pskv-launch`", S::kLauncher,
     "where a node writes its status records for the launcher (`fd:N` or `stderr`), which "
     "names a hung or failed process from them ([docs/design.md](docs/design.md#status-channel))",
     ApplyStatus},
    // ---- reliability and failure detection
    {"PS_RESEND", T::kBool, 0, 1, "", "0", S::kJob,
     "1: acknowledge and retransmit lost messages (each message is kept as a private copy until "
     "acknowledged: one more copy per byte sent)",
     Bool<&Options::resend>},
    {"PS_RESEND_TIMEOUT", T::kMillis, 1, 3600000, "", "1000 ms", S::kJob,
     "with `PS_RESEND=1`, a message not acknowledged within this many ms is sent again",
     Millis<&Options::resend_timeout>},
    {"PS_HEARTBEAT_INTERVAL", T::kSeconds, 0, kMaxSeconds, "", "1 s", S::kJob,
     "how often nodes send heartbeats", Seconds<&Options::heartbeat_interval>},
    {"PS_HEARTBEAT_TIMEOUT", T::kSeconds, 0, kMaxSeconds, "", "10 s", S::kJob,
     "a node silent this long is declared dead (failure detection, on by default, unlike "
     "ps-lite); 0 disables it",
     Seconds<&Options::heartbeat_timeout>},
    {"PSKV_REGISTER_TIMEOUT", T::kSeconds, 0, kMaxSeconds, "", "60 s", S::kJob,
     "start-up waits this long for all nodes", Seconds<&Options::register_timeout>},
    {"PSKV_TIMEOUT", T::kSeconds, 0, kMaxSeconds, "", "600 s", S::kJob,
     "timeout of blocking calls (Wait, Barrier, commands)", Seconds<&Options::op_timeout>},
    // ---- security
    {"PSKV_JOB_ID", T::kText, 0, 0, "", "scheduler address", S::kLauncher,
     "nodes of another job are refused", Text<&Options::job_id>},
    {"PSKV_JOB_SECRET", T::kText, 0, 0, "", "set by `pskv-launch`", S::kLauncher,
     "per-job secret every connection must prove; without one a job is open to anyone who can "
     "reach it ([docs/security.md](docs/security.md))",
     Text<&Options::job_secret>},
    {"PSKV_JOB_SECRET_FILE", T::kText, 0, 0, "", "—", S::kLauncher,
     "a private file (mode 600) holding the job secret, instead of `PSKV_JOB_SECRET`",
     ApplySecretFile},
    {"PSKV_ENCRYPT", T::kBool, 0, 1, "", "0", S::kJob,
     "1: encrypt everything (ZeroMQ CURVE keyed from the secret)", Bool<&Options::encrypt>},
    // ---- transport
    {"PSKV_SHM", T::kChoice, 0, 0, "0|1|auto", "auto", S::kJob,
     "shared memory between nodes of one host (docs/transport.md): auto, 1 (always offer), 0 "
     "(TCP only)",
     Choice<&Options::shm>},
    {"PSKV_TCP_DIRECT", T::kBool, 0, 1, "", "1", S::kJob,
     "1: data between nodes that share no memory over pskv's own TCP connections (small "
     "operations ~2x faster; one more port per node, chosen by the kernel); 0: through ZeroMQ "
     "(where only fixed ports are open; docs/transport.md). Not used with `PSKV_ENCRYPT=1`",
     Bool<&Options::tcp_direct>},
    {"PSKV_SHM_RING_BYTES", T::kInt, 4096, kGiB, "", "8 MiB", S::kJob,
     "size of each shared-memory ring (one per direction and co-located pair; a power of two)",
     Int<&Options::shm_ring_bytes>},
    {"PSKV_MAX_CONNECTIONS", T::kInt, 0, 1 << 20, "", "4×nodes+64", S::kJob,
     "connections not yet authenticated a node keeps, at most (one source address: a quarter)",
     Int<&Options::max_pending_connections>},
    {"PSKV_HANDSHAKE_TIMEOUT", T::kSeconds, 0, kMaxSeconds, "", "10 s", S::kJob,
     "a connection not authenticated within this time is closed (must be > 0)",
     Seconds<&Options::handshake_timeout>},
    // ---- sync rounds
    {"PSKV_STALL_WARNING", T::kSeconds, 0, kMaxSeconds, "", "60 s", S::kJob,
     "a sync round, command or wait stalled this long logs what it waits for (again at 2x, 4x, "
     "...); a worker whose wait stalled this long on a round that needs a push from a worker in "
     "`Barrier()` gets a `TimeoutError` naming both (deadlock). 0 disables",
     Seconds<&Options::stall_warning>},
    {"PSKV_STRICT_ROUNDS", T::kBool, 0, 1, "", "0", S::kJob,
     "1: in `dist_sync`, a pull of a key not pushed in the current round, or a second push in "
     "one round, is a `UsageError` at that call "
     "([docs/mxnet-differences.md](docs/mxnet-differences.md#strict-rounds))",
     Bool<&Options::strict_rounds>},
    {"PSKV_SUM_ORDER", T::kChoice, 0, 0, "rank|arrival", "`rank`", S::kJob,
     "how a `dist_sync` server sums a round: `rank` (bit-reproducible) or `arrival`",
     ApplySumOrder},
    {"MXNET_UPDATE_ON_KVSTORE", T::kBool, 0, 1, "", "the trainer's policy", S::kJob,
     "whether a Trainer (C++ or Python) given no `update_on_kvstore` updates the weights "
     "on the servers (1) or on each worker (0), before the rest of MXNet's policy "
     "(`include/pskv/trainer_policy.h`); read when the store is created; MXNet's variable",
     ApplyUpdateOnKVStore},
    // ---- reduction, fusion and the wire
    {"MXNET_KVSTORE_BIGARRAY_BOUND", T::kInt, 1, kMaxI64, "", "1000000", S::kJob,
     "arrays this big are reduced with threads and sliced over all servers",
     Int<&Options::bigarray_bound>},
    {"PSKV_SERVER_WEIGHTS", T::kText, 0, 0, "", "`auto`", S::kJob,
     "how much of each big dense key every server holds: `balanced` (shares that balance the "
     "hosts' links: a server on a host with workers gets less than one on a host of its own), "
     "`auto` (`balanced` where it leaves the servers on worker hosts nothing, else `even`: "
     "measured faster, [performance](docs/performance.md#across-hosts-dense-pushpull-against-"
     "the-parameter-server-bound)), `even`, or one whole-number weight per server rank "
     "(`1,1,3,3`)",
     ApplyServerWeights},
    {"PSKV_REPLICAS", T::kInt, 0, 64, "", "0", S::kJob,
     "copies of every server's key ranges (dense keys; row_sparse keys in dist_sync, their "
     "pushes in dist_async are refused) on other servers besides the primary: with 1 or more a "
     "killed server's ranges are taken "
     "over by a replica and the job continues (dist_sync: bitwise-equal; dist_async: each push "
     "applied once); each step costs more (measured beside its floor in the docs); 0: a dead "
     "server ends the job; more than `DMLC_NUM_SERVER` - 1 (any with one server) is an error at "
     "start ([fault tolerance](docs/fault-tolerance.md))",
     Int<&Options::replicas>},
    {"PSKV_HELD_REQUEST_BYTES", T::kInt, 1024, int64_t{1} << 40, "", "1 GiB", S::kJob,
     "with `PSKV_REPLICAS`: the most bytes of one worker's requests a server keeps for key "
     "ranges it holds but does not lead yet, until the range table promoting it arrives (each "
     "request counts at least 1 KiB); past it requests are refused with an error saying so "
     "([fault tolerance](docs/fault-tolerance.md#replicated-servers-first-slice-built))",
     Int<&Options::held_request_bytes>},
    {"PSKV_ELASTIC", T::kBool, 0, 1, "", "0", S::kJob,
     "1: elastic workers: a worker that dies is dropped from the job instead of ending it; the "
     "sync rounds it had not pushed close with the pushes that arrived, their sum scaled by "
     "`DMLC_NUM_WORKER` / contributors ([fault tolerance](docs/fault-tolerance.md#elastic-"
     "workers)); 0: a dead worker ends the job (MXNet's strict rounds)",
     Bool<&Options::elastic>},
    {"PSKV_MIN_WORKERS", T::kInt, 1, 1 << 20, "", "1", S::kJob,
     "with `PSKV_ELASTIC=1`: the job fails when fewer workers than this are left",
     Int<&Options::min_workers>},
    {"MXNET_KVSTORE_REDUCTION_NTHREADS", T::kInt, 1, 1024, "", "4", S::kJob,
     "reduction threads (capped at the number of cores); on a server, they merge the 1 MiB "
     "chunks of a big value in parallel",
     Int<&Options::reduction_threads>},
    {"PSKV_SERVER_THREADS", T::kInt, 0, 256, "",
     "cores (≤ 8); `pskv-launch` local: "
     "cores / processes",
     S::kJob,
     "a server's threads: its keys are sharded over them (same key, same thread, in arrival "
     "order)",
     Int<&Options::server_threads>},
    {"PSKV_FUSION_KEY_BYTES", T::kInt, 0, kGiB, "", "64 KiB", S::kJob,
     "in one `Push`/`Pull`/`PushPull` call, keys of at most this many bytes bound for the same "
     "server travel together in fused messages; 0 disables fusion",
     Int<&Options::fusion_key_bytes>},
    {"PSKV_FUSION_BYTES", T::kInt, 1, kGiB, "", "1 MiB", S::kJob,
     "the most value bytes one fused message carries", Int<&Options::fusion_bytes>},
    {"PSKV_INLINE_START_BYTES", T::kInt, 0, kGiB, "", "64 KiB", S::kJob,
     "a push, pull or push-pull of one key with at most this many value bytes starts on the "
     "calling thread when nothing else waits to start (one thread hand-off less); 0: always on "
     "the engine's thread",
     Int<&Options::inline_start_bytes>},
    {"PSKV_SPIN_US", T::kInt, 0, 10000, "", "100", S::kJob,
     "before sleeping, a node's receive thread (if a message of ≤ 64 KiB came within 20× this) "
     "and a caller waiting on a dist store look again without sleeping for up to this many µs, "
     "yielding the core to any runnable thread between looks: small operations 1.5–3× faster "
     "where idle cores halt; an idle process does not spin; 0: never",
     Int<&Options::spin_us>},
    {"PSKV_WIRE_CHUNK_BYTES", T::kInt, 0, int64_t{1} << 40, "", "256 KiB", S::kJob,
     "a dense key's slice on a server bigger than this travels as chunks of about this size, "
     "each its own message, so that a more urgent key can overtake it; 0: off; all nodes must "
     "agree ([design](docs/design.md#priorities-on-the-wire))",
     Int<&Options::wire_chunk_bytes>},
    {"PSKV_WIRE_WINDOW_BYTES", T::kInt, 0, int64_t{1} << 40, "", "512 KiB", S::kJob,
     "per destination, bytes of big messages (≥ 64 KiB) in flight and not yet acknowledged; the "
     "others wait in priority order while smaller messages go at once; 0: off (FIFO)",
     Int<&Options::wire_window_bytes>},
    {"PSKV_WIRE_AHEAD_BYTES", T::kInt, 0, int64_t{1} << 40, "", "512 KiB", S::kJob,
     "per server, bytes of one key's pushed pieces a worker sent that the server has not yet "
     "answered; later pieces wait for answers, so no worker runs further ahead of the slowest "
     "one and sync rounds complete steadily; 0: off (all pieces at once)",
     Int<&Options::wire_ahead_bytes>},
    {"PSKV_LINK_RATE", T::kInt, 0, int64_t{1} << 40, "", "1", S::kJob,
     "bytes per second of each host's link (e.g. 12000000 for 100 Mbit/s): the kernel paces "
     "each connection between a worker and a server on another host at this rate times the "
     "server's share of big keys over the busiest link's load, so that no link's queue "
     "fills (`PSKV_WIRE_AHEAD_BYTES` is then not applied; with `PSKV_REPLICAS` the load counts "
     "the copies of the rounds to the replicas), and a big "
     "key's slices bigger than "
     "`PSKV_WIRE_CHUNK_BYTES` travel in finer chunks (a 32nd of the slice, at least 16 KiB; "
     "a server's consecutive chunks in messages of 1 ms of the link's rate, at most an 8th of "
     "its part) so that a server's answers keep up with the pushes; small keys go "
     "no faster than their connection's rate; 1 (the default): the same at a rate learned "
     "while the job runs, where its nodes are on more than one host: each node's from its "
     "connections' TCP_INFO and its host interface's byte counters (a start-up that doubles "
     "the caps until the link holds them, then caps 4 % above the estimate, so that every "
     "busy window shows the link and windows the caps held raise it), one rate for the job "
     "shared through the heartbeats (the median of the nodes'); 0: off "
     "([performance](docs/"
     "performance.md#across-hosts-dense-pushpull-against-the-parameter-server-bound))",
     ApplyLinkRate},
    // ---- observability
    {"PSKV_TIMELINE", T::kText, 0, 0, "", "—", S::kJob,
     "write a Chrome trace (`chrome://tracing`, Perfetto) of every push/pull/pushpull per key: "
     "`trace.json` becomes `trace.<role>.<pid>.json` per process; `python3 -m pskv.timeline "
     "merge trace.json -o job.json` joins them, one lane per node",
     Text<&Options::timeline_path>},
    {"PSKV_METRICS_PORT", T::kInt, 0, 65535, "", "—", S::kJob,
     "serve Prometheus text at `http://host:PORT/metrics` (the next free port for further "
     "processes on a host; each logs its URL)",
     Int<&Options::metrics_port>},
    {"PSKV_METRICS_HOST", T::kText, 0, 0, "", "127.0.0.1", S::kJob,
     "address the (unauthenticated) metrics endpoint binds; 0.0.0.0 for a Prometheus on another "
     "host",
     Text<&Options::metrics_host>},
    {"PSKV_METRICS_FILE", T::kText, 0, 0, "", "—", S::kJob,
     "write the same metrics at exit (`.<role>.<pid>` inserted)", Text<&Options::metrics_file>},
    // ---- the program's own environment, passed on by remote launchers
    {"OMP_NUM_THREADS", T::kForwarded, 0, 0, "", "—", S::kJob,
     "not read by pskv; remote launchers pass it on to the program", nullptr},
    {"OPENBLAS_NUM_THREADS", T::kForwarded, 0, 0, "", "—", S::kJob,
     "not read by pskv; remote launchers pass it on to the program", nullptr},
    {"LD_LIBRARY_PATH", T::kForwarded, 0, 0, "", "—", S::kHost,
     "not read by pskv; remote launchers pass it on to the program", nullptr},
    {"PYTHONPATH", T::kForwarded, 0, 0, "", "—", S::kHost,
     "not read by pskv; remote launchers pass it on to the program", nullptr},
    {"PATH", T::kForwarded, 0, 0, "", "—", S::kHost,
     "not read by pskv; remote launchers pass it on to the program", nullptr},
    // ---- the device runtime (device/runtime.h reads these once, when it initialises)
    {"PSKV_SIM_DEVICES", T::kInt, 0, 64, "", "unset (off)", S::kJob,
     "k: k **simulated** devices `cuda:0..k-1` instead of GPUs (docs/gpu.md): device memory the "
     "host cannot touch, streams as threads, exact copy counters; a dry run of multi-device "
     "code on any machine, never a silent fallback",
     nullptr},
    {"PSKV_SIM_JITTER", T::kInt, 0, int64_t{1} << 62, "", "0 (off)", S::kJob,
     "seed of random delays before each task of each simulated stream, so that a missing "
     "stream wait shows up as a wrong value (with PSKV_SIM_DEVICES)",
     nullptr},
    {"MXNET_ENABLE_GPU_P2P", T::kBool, 0, 1, "", "1", S::kJob,
     "0: copies between devices go through pinned host memory instead of peer to peer", nullptr},
    // ---- test-only (not in Options)
    {"PSKV_CUDA_FAKE_DEVICES", T::kInt, 1, 64, "", "unset (real devices)", S::kTest,
     "k: logical CUDA devices 0..k-1 all map onto GPU 0, so multi-GPU code paths run on one "
     "GPU; read by the device runtime (device/runtime.h) when it initialises, not into Options",
     nullptr},
};

}  // namespace

std::span<const EnvVar> EnvVars() {
  return kVars;
}

const EnvVar* FindEnvVar(const std::string& name) {
  for (const auto& v : kVars)
    if (name == v.name) return &v;
  return nullptr;
}

const char* EnvValue(const char* name) {
  if (!FindEnvVar(name))
    throw std::logic_error(std::string("EnvValue: ") + name +
                           " is not in the environment table (common/env_table.cc)");
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

bool IsServerWeightsKeyword(const std::string& value) {
  return value == "auto" || value == "even" || value == "balanced";
}

std::vector<int64_t> ParseServerWeights(const std::string& value) {
  std::vector<int64_t> w;
  int64_t total = 0;
  size_t at = 0;
  for (;;) {
    const size_t comma = value.find(',', at);
    const std::string part = value.substr(at, comma == std::string::npos ? comma : comma - at);
    const bool digits = !part.empty() && part.size() <= 7 &&
                        part.find_first_not_of("0123456789") == std::string::npos;
    const int64_t x = digits ? std::stoll(part) : -1;
    if (x < 0 || x > 1000000)
      throw ConfigError(
          "environment variable PSKV_SERVER_WEIGHTS='" + value +
          "' is not `auto`, `even`, `balanced` or a list of whole numbers in [0, 1000000], "
          "one per server rank (e.g. `1,1,3,3`)");
    w.push_back(x);
    total += x;
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  if (total == 0)
    throw ConfigError("environment variable PSKV_SERVER_WEIGHTS='" + value +
                      "' gives every server weight 0: at least one must hold the big keys");
  return w;
}

std::string ReadJobSecretFile(const char* path) {
  struct stat st {};
  if (::stat(path, &st) != 0)
    throw ConfigError(std::string("PSKV_JOB_SECRET_FILE='") + path +
                      "' cannot be read: " + std::strerror(errno));
  if (st.st_mode & 077)
    throw ConfigError(std::string("PSKV_JOB_SECRET_FILE='") + path +
                      "' is readable or writable by other users; make it private with "
                      "`chmod 600 " +
                      path + "`");
  if (st.st_size > 4096)
    throw ConfigError(std::string("PSKV_JOB_SECRET_FILE='") + path +
                      "' is larger than 4096 bytes: is it the right file?");
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  if (!f || s.empty())
    throw ConfigError(std::string("PSKV_JOB_SECRET_FILE='") + path + "' is empty or unreadable");
  return s;
}

const char* EnvScopeName(EnvScope s) {
  switch (s) {
    case EnvScope::kJob:
      return "job";
    case EnvScope::kHost:
      return "host";
    case EnvScope::kProcess:
      return "process";
    case EnvScope::kLauncher:
      return "launcher";
    case EnvScope::kTest:
      return "test";
  }
  return "?";
}

const char* EnvTypeName(EnvType t) {
  switch (t) {
    case EnvType::kInt:
      return "int";
    case EnvType::kBool:
      return "bool";
    case EnvType::kSeconds:
      return "seconds";
    case EnvType::kMillis:
      return "ms";
    case EnvType::kText:
      return "text";
    case EnvType::kChoice:
      return "choice";
    case EnvType::kForwarded:
      return "forwarded";
  }
  return "?";
}

}  // namespace pskv
