// ReadSendStats (direct_tcp.h) on its own: it needs the kernel's struct tcp_info
// (<linux/tcp.h>), which cannot share a file with glibc's <netinet/tcp.h>.
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "transport/tcp/direct_tcp.h"

namespace pskv::direct {

bool ReadSendStats(int fd, TcpSendStats* out) {
  tcp_info ti{};
  socklen_t len = sizeof ti;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return false;
  // An older kernel fills less: without the chrono counters (Linux 4.10) the
  // connection's busy time is unknown, and so is its rate.
  if (len < offsetof(tcp_info, tcpi_sndbuf_limited) + sizeof ti.tcpi_sndbuf_limited) return false;
  out->bytes_acked = ti.tcpi_bytes_acked;
  out->busy_us = ti.tcpi_busy_time;  // includes the rwnd- and sndbuf-limited times
  return true;
}

}  // namespace pskv::direct
