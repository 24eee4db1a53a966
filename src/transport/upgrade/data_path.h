// A data path: a faster way for one direction of a pair of nodes than the
// authenticated control connection (ZeroMQ), negotiated over it by the
// UpgradingTransport (upgrade/upgrading_transport.h) with the control codec
// (upgrade/control_codec.h). Two exist: a shared-memory ring (shm/ring_path.h)
// and a direct TCP socket (tcp/socket_path.h). A new one (RDMA, CMA, GPU IPC) is
// a folder implementing these three classes, a PathKind number, a RegisterDataPath
// call in its own file (the negotiator includes no path's header), and passing
// DataPathSuite and TransportSuite (tests/transport/test_transport.cc;
// docs/transport.md, "Add a data path").
//
// The negotiation, for sender B and receiver A (the negotiator runs it; a path
// only answers its questions):
//  1. B: DataPath::Wants(peer) picks the first path that wants the peer;
//     DataPath::Offer makes B's end (an OutPath) and the offer's details, sent
//     as OFFER over the control connection.
//  2. A: DataPath::Accept makes A's end (an InPath) from the details, or
//     declines (null: B stays on the control connection).
//  3. B: OutPath::Accepted says when A has taken it; B sends SWITCH over the
//     control connection and from then on writes that pair's messages into the
//     path (OutPath::Write).
//  4. A: on SWITCH, InPath::Activate; from then on A reads the path
//     (InPath::Read). Before SWITCH, InPath::Check says whether data already
//     waits (it came ahead of its SWITCH; A waits for the SWITCH until B is cut
//     off, incoming_paths.h).
// Order: everything B sent over the control connection before SWITCH is older
// than anything on the path; a message over the control connection after the
// switch means B gave the path up (A drops it; unread messages are lost, never
// reordered).
//
// Threads: OutPath is used under its peer's lock (any sending thread, and the
// transport's writer thread); InPath only by the Recv thread; DataPath's
// Service/PollFds only by the writer thread, Offer under a peer's lock, Accept by
// the Recv thread.
#pragma once

#include <poll.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/frame.h"
#include "common/rate_limit.h"
#include "transport/auth.h"
#include "transport/framing.h"
#include "transport/transport.h"
#include "transport/upgrade/control_codec.h"

namespace pskv::upgrade {

using Clock = std::chrono::steady_clock;

/// What the hosting transport lends its paths. The descriptors stay the
/// transport's (it closes them).
struct PathHost {
  const TransportConfig* cfg = nullptr;
  const JobKeys* keys = nullptr;
  int pid = 0;
  int rx_wake = -1;  ///< write end of the pipe that wakes the Recv thread
  int tx_wake = -1;  ///< write end of the pipe that wakes the writer thread
  int epfd = -1;     ///< the Recv thread's epoll set (event data: the fd)
};

/// Writes `1` into a wake-up pipe (-1: nothing). Never blocks.
void Signal(int fd);

/// The sending end of one path (sender B). Under the peer's lock.
class OutPath {
 public:
  virtual ~OutPath() = default;
  enum class Taken { kWaiting, kTaken, kRefused };
  /// After the offer: has the receiver taken the path? kRefused (with *why): it
  /// cannot be used with this peer; the negotiator gives it up for good.
  virtual Taken Accepted(std::string* why) = 0;
  /// While in use: the receiver stopped reading (found something invalid). The
  /// path is given up for good (*why for the log).
  virtual bool ReaderGone(std::string* why) { return false; }
  enum class Written { kOk, kBroken, kInvalid };
  /// Moves queued messages into the path, bounded per call (so that the peer's
  /// lock is never held long: the writer thread carries on, woken through
  /// PathHost::tx_wake unless `from_writer`). Pops the messages completed.
  /// kBroken: the connection failed (retry later); kInvalid: the peer broke the
  /// path's rules (never again). *written: bytes moved.
  virtual Written Write(std::deque<framing::OutMsg>& q, bool from_writer, uint64_t* written,
                        std::string* why) = 0;
  /// For the writer thread's sleep while messages wait: descriptors to watch.
  virtual void WatchForSpace(std::vector<pollfd>* fds) const {}
  /// Transport::SetPacingRate for this path (0: no cap); paths that are no
  /// socket ignore it.
  virtual void SetPacingRate(uint64_t bytes_per_s) {}
  /// Transport::SendStats for this path; false where it is no socket.
  virtual bool SendStats(TcpSendStats* out) const { return false; }
  /// Gives the path up; the reader still gets what was written. `switched`:
  /// SWITCH was sent (the reader may be waiting for data).
  virtual void Close(bool switched) = 0;
};

/// The receiving end of one path (receiver A). Recv thread only.
class InPath {
 public:
  virtual ~InPath() = default;
  /// The descriptor this end added to PathHost::epfd, or -1.
  virtual int fd() const { return -1; }
  enum class Status { kOk, kDrop, kDataWaiting };
  /// An epoll event on fd(). kDrop: give the path up (*why, null: quietly).
  virtual Status OnEvent(uint32_t events, const char** why) { return Status::kOk; }
  /// SWITCH arrived. kDrop: the path cannot be used.
  virtual Status Activate(const char** why) = 0;
  /// Before SWITCH, at every look: kDrop (the path is not set up in time, or its
  /// writer gave it up with nothing written), kDataWaiting (data came ahead of
  /// its SWITCH), kOk.
  virtual Status Check(Clock::time_point now, const char** why) = 0;
  enum class Read { kNothing, kMessage, kClosed, kBad };
  /// After SWITCH: up to one message into *frames. kClosed: the writer closed
  /// and everything was read; kBad: *why.
  virtual Read Pump(std::vector<Frame>* frames, const char** why) = 0;
  /// Before the Recv thread sleeps: asks for a wake-up; true if data is there
  /// already (do not sleep). Disarm after the sleep.
  virtual bool Arm() = 0;
  virtual void Disarm() {}
  /// Data is visible now without a system call (for spinning).
  virtual bool Ready() const { return false; }
  /// The reader stops reading (the writer sees it on its next write).
  virtual void Close() = 0;
};

/// One kind of path: what is shared by all peers of a transport (a listener,
/// the host's identity) and how ends are made.
class DataPath {
 public:
  virtual ~DataPath() = default;
  virtual PathKind kind() const = 0;
  /// Called once, at Bind (host: what the control connection bound).
  virtual void Bind(const std::string& host) {}
  /// Whether to offer this path to a peer reached at `endpoint` proving `token`.
  virtual bool Wants(const std::string& endpoint, uint64_t token) const = 0;
  /// B's end and the offer's nonce and details; null when the path is unusable
  /// now (*why; the negotiator then offers nothing to this peer for good).
  virtual std::unique_ptr<OutPath> Offer(Nonce* nonce, std::string* details, std::string* why) = 0;
  /// An offer declined silently (never attached by the deadline): offer again
  /// after this long (zero: never).
  virtual std::chrono::milliseconds RetryDeclinedAfter() const { return {}; }
  /// A's end for an offer from `from` (its address for log lines); null to
  /// decline (*why non-empty: worth a warning).
  virtual std::unique_ptr<InPath> Accept(const upgrade::Offer& offer, const std::string& from,
                                         std::string* why) = 0;
  /// Writer thread: what it must also watch, and the turn after they are ready
  /// (or every 100 ms). `adopt(nonce, fn)`: calls fn with the OutPath of this
  /// kind whose offer has that nonce (under its peer's lock); false if none.
  using Adopt = std::function<bool(const Nonce&, const std::function<bool(OutPath&)>&)>;
  virtual void PollFds(std::vector<pollfd>* fds) {}
  virtual void Service(const Adopt& adopt) {}
  /// Releases what Bind opened.
  virtual void Close() {}
  /// Transport-wide facts for tests ("port" of a listener).
  virtual int Port() const { return 0; }
};

/// Makes a transport's instance of one kind of path.
using DataPathCreator = std::function<std::unique_ptr<DataPath>(const PathHost&)>;
/// Registers a kind of path, from a static initializer in the path's own file (like
/// RegisterTransport): `name` is what DataPath(transport, peer) reports for a peer on
/// it ("shm", "tcp"), `label` what log lines call it ("shared memory");
/// `preference` orders the paths of a transport (lower first: a peer gets the first
/// path that wants it). Registering a PathKind twice is a programming error
/// (InternalError). Returns true (for the initializer).
bool RegisterDataPath(PathKind kind, const char* name, const char* label, int preference,
                      DataPathCreator create);
/// One of every registered kind of path for a transport, in order of preference.
std::vector<std::unique_ptr<DataPath>> CreateDataPaths(const PathHost& host);
/// The registered name of a kind of path ("shm", "tcp"; "zmq" for an unregistered one).
const char* DataPathName(PathKind kind);
/// The registered label of a kind of path, for log lines ("shared memory", "direct
/// TCP"; "unknown path" for an unregistered one, e.g. a newer peer's offer).
const char* PathName(PathKind kind);

}  // namespace pskv::upgrade
