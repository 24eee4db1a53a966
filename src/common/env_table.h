// The table of every environment variable pskv knows: its one source of truth.
//
// Each entry says what the variable is called, what it holds (type,
// range or choices, default), whether it is job-wide or per process, and a one-line
// doc. The table drives:
//   - Options::FromEnv (common/options.cc): each entry's `apply` parses and range-checks
//     its value into Options; cross-field rules are checked after the loop;
//   - every launcher's forwarding (launcher/cli.cc): a launcher passes each
//     kJob (and, to hosts, kHost) variable set in its own environment to every node;
//   - the README's configuration table, which tests/python/test_docs.py compares
//     with this table (pskv._pskv.env_table() exposes it to Python), and the check
//     that no code in src/ or python/ reads or names a variable missing here.
//
// Scopes:
//   kJob      every node of a job must see the same value (or should: a tuning that
//             differs per node is a surprise); every launcher forwards it.
//   kHost     the same, but about the hosts (paths, NIC names): forwarded to nodes on
//             hosts (ssh, mpi, slurm, sge, yarn), not into containers (kubernetes),
//             whose image has its own.
//   kProcess  per node (its own address or port); launchers do not forward it.
//   kLauncher pskv-launch sets it for each node it starts (role, scheduler address,
//             job size, id, secret); a launcher does not forward its own value.
//   kTest     for tests only (not in Options); not documented for users, not
//             forwarded. The library's own test hooks are not variables: tests install
//             FailPoints (ps/fail_points.h).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "pskv/options.h"

namespace pskv {

enum class EnvScope { kJob, kHost, kProcess, kLauncher, kTest };

/// What a variable's value is. kForwarded: pskv does not read it, a launcher passes
/// it on (the program's own environment: PATH, PYTHONPATH, OMP_NUM_THREADS, ...).
enum class EnvType { kInt, kBool, kSeconds, kMillis, kText, kChoice, kForwarded };

struct EnvVar {
  const char* name;
  EnvType type;
  int64_t lo, hi;            ///< range of kInt/kMillis/kSeconds (seconds: in whole seconds)
  const char* choices;       ///< kChoice: "a|b|c"; else ""
  const char* default_text;  ///< for people ("60 s", "auto", "—")
  EnvScope scope;
  const char* doc;  ///< one line (Markdown: the README's table shows it as is)
  /// Parses `value` (set and non-empty) into `o`; throws ConfigError naming the
  /// variable. Null for variables pskv does not read into Options.
  void (*apply)(const EnvVar& var, const char* value, Options& o);
};

/// Parses a whole number in [var.lo, var.hi]; ConfigError naming the variable.
int64_t EnvInt(const EnvVar& var, const char* value);

/// Every variable, in the README's order.
std::span<const EnvVar> EnvVars();
/// The entry called `name`; null if none.
const EnvVar* FindEnvVar(const std::string& name);

/// The value of a table variable in this process's environment, null when unset or
/// empty. The one way pskv (library and launcher) reads its environment; `name`
/// must be in the table (a programming error otherwise: std::logic_error).
const char* EnvValue(const char* name);

/// PSKV_SERVER_WEIGHTS' list form "w0,w1,...": whole numbers in [0, 1000000], at
/// least one positive. ConfigError naming the variable otherwise (also for the
/// keywords, which are not lists).
std::vector<int64_t> ParseServerWeights(const std::string& value);
/// Whether `value` is one of PSKV_SERVER_WEIGHTS' keywords ("auto", "even",
/// "balanced") rather than a list of weights.
bool IsServerWeightsKeyword(const std::string& value);

/// What every worker of a job must set alike to cut and name its keys alike (a
/// chunk of a slice is a ps key; the workers name which elements each server holds):
/// "PSKV_WIRE_CHUNK_BYTES=262144 PSKV_LINK_RATE=off PSKV_SERVER_WEIGHTS=auto".
/// PSKV_LINK_RATE counts only as on, learned or off (its value paces, the mode cuts).
std::string WorkerLayoutSettings(const Options& o);

/// Reads the job secret from the file named by PSKV_JOB_SECRET_FILE: a private file
/// (not readable or writable by group or others, like ssh's keys), at most 4096
/// bytes, trailing newlines dropped. Throws ConfigError naming the variable.
std::string ReadJobSecretFile(const char* path);

const char* EnvScopeName(EnvScope s);
const char* EnvTypeName(EnvType t);

}  // namespace pskv
