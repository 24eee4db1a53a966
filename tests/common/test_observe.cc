// The metrics endpoint (PSKV_METRICS_PORT) under hostile clients (issue 22, item 5):
// it served one connection at a time with a blocking send() and no timeout, so one
// client that never reads froze every later scrape, and each idle connection held
// the next scrape for 2 s. Real sockets on loopback; one process-wide endpoint.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/observe.h"
#include "pskv/options.h"

using namespace pskv;
using Clock = std::chrono::steady_clock;

namespace {

int Port() {
  static const int port = [] {
    Options o;
    o.metrics_port = 23000 + static_cast<int>(::getpid() % 20000);
    o.metrics_host = "127.0.0.1";
    obs::Configure(o, "worker");
    return obs::MetricsPort();
  }();
  return port;
}

int Connect(int rcvbuf = 0) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (rcvbuf) ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(Port()));
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  return fd;
}

void SendRequest(int fd) {
  const std::string req = "GET /metrics HTTP/1.0\r\n\r\n";
  ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
}

// A full scrape within `limit` (empty string when it took longer).
std::string Scrape(std::chrono::milliseconds limit) {
  const int fd = Connect();
  SendRequest(fd);
  std::string got;
  const auto until = Clock::now() + limit;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) {
      got.clear();
      break;
    }
    char buf[65536];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return got;
}

}  // namespace

TEST(MetricsEndpoint, IdleConnectionsDoNotDelayAScrape) {
  ASSERT_GT(Port(), 0);
  obs::CountOp("push", "3", 100, 50);
  std::vector<int> idle;
  for (int i = 0; i < 10; ++i) idle.push_back(Connect());  // connect, send nothing
  const auto t0 = Clock::now();
  const std::string text = Scrape(std::chrono::seconds(30));
  const auto took = Clock::now() - t0;
  EXPECT_NE(text.find("pskv_ops_total{"), std::string::npos) << text.substr(0, 200);
  // Served one at a time, the scrape waited 2 s for each idle connection (20 s).
  EXPECT_LT(took, std::chrono::milliseconds(1500));
  for (int fd : idle) ::close(fd);
}

// A connection that sends no request within 2 s is closed without an answer (an
// answer would cost the whole text per connection of a flood).
TEST(MetricsEndpoint, ASilentConnectionIsClosedUnanswered) {
  ASSERT_GT(Port(), 0);
  obs::CountOp("push", "3", 100, 50);
  const int fd = Connect();
  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 6000), 1) << "not closed within 6 s";
  char buf[256];
  EXPECT_EQ(::recv(fd, buf, sizeof buf, 0), 0) << "answered or reset instead of closed";
  ::close(fd);
}

TEST(MetricsEndpoint, AClientThatNeverReadsDoesNotFreezeTheNextScrape) {
  ASSERT_GT(Port(), 0);
  // Enough keys for a response (~20 MB) that no socket buffer holds.
  const std::string pad(100, 'k');
  for (int k = 0; k < 5000; ++k) obs::CountOp("push", pad + std::to_string(k), 100, 50);
  const int stuck = Connect(4096);
  SendRequest(stuck);  // and never reads the answer
  ::usleep(300 * 1000);
  const std::string text = Scrape(std::chrono::seconds(30));
  EXPECT_NE(text.find("pskv_ops_total{"), std::string::npos);
  EXPECT_NE(text.find(pad + "4999"), std::string::npos);
  ::close(stuck);
  // Many connections at once: each is served or closed, none blocks the endpoint.
  std::vector<int> flood;
  for (int i = 0; i < 40; ++i) flood.push_back(Connect());
  EXPECT_NE(Scrape(std::chrono::seconds(30)).find("pskv_ops_total{"), std::string::npos);
  for (int fd : flood) ::close(fd);
}
