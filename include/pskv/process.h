// Process-wide settings: made by programs, never by the library. Creating, using and
// destroying stores and nodes leaves the process's log name, log levels, timeline,
// metrics and allocator as they were, so several stores and nodes can share one
// process (tests, a trainer with two stores) without overwriting each other.
//
// A program calls ConfigureProcess once, early in main, to get what the PSKV_*
// variables ask for. pskv's own programs do: pskv-server (through
// RunServerRoleIfAsked, which turns the process into a server or scheduler),
// pskv-launch, pskv-bench, the examples, and the Python package when it creates its
// first dist store (python/pskv/process.py). The allocator is tuned separately, only
// by programs that ask (pskv/tuning.h).
#pragma once

#include "pskv/options.h"

namespace pskv {

/// Configures this process from `options` (Options::FromEnv() fills them from
/// PSKV_LOG_LEVEL, PSKV_TIMELINE, PSKV_METRICS_PORT, PSKV_METRICS_HOST and
/// PSKV_METRICS_FILE):
///  - the log levels per module (options.log_levels; unchanged when empty);
///  - the log name: with DMLC_ROLE set (options.role_set), every line of the process
///    is prefixed with its role ("server") until the process's first node has joined
///    its job, then with that node's name ("worker[1]"); without, "pskv". Lines of a
///    node's own threads always carry the node's name;
///  - the timeline and the metrics (docs/observability.md): recording starts, a
///    thread serves the metrics endpoint until the process exits, and the metrics
///    file and the end of the timeline are written at exit (std::atexit).
/// The first call configures the timeline and metrics; later calls only change the
/// log levels and name. Thread-safe. Throws ConfigError on a malformed
/// PSKV_LOG_LEVEL, IOError when the timeline cannot be written or no port near
/// PSKV_METRICS_PORT can be bound.
void ConfigureProcess(const Options& options);

/// ConfigureProcess(Options::FromEnv()).
void ConfigureProcess();

}  // namespace pskv
