// The metrics endpoint of a process (PSKV_METRICS_PORT, docs/observability.md): an
// HTTP/1.0 server that answers every request with the text of the process's counters.
// Serves scrapes without letting one client hold up another: at most 16 connections
// served together (nonblocking, poll), each bounded in time (2 s to send the request
// head, answered anyway after that; 10 s in all).
#pragma once

#include <functional>
#include <string>

namespace pskv::obs {

/// A listening TCP socket on `host` (an IPv4 address) at the first free port of
/// [port, port + 64) (the processes of a job on one host share one PSKV_METRICS_PORT
/// setting); the port in *bound. -1 when none is free. Throws ConfigError when `host`
/// is not an IPv4 address.
int ListenForMetrics(const std::string& host, int port, int* bound);

/// Serves scrapes on `listen_fd` until the process ends, answering each with
/// `text()` (built per scrape; it must not wait for the process's operations).
/// Run on a thread of its own.
[[noreturn]] void ServeMetrics(int listen_fd, const std::function<std::string()>& text);

}  // namespace pskv::obs
