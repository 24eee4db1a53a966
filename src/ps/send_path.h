// SendPath: the sending side of a Node, as a component that owns that state — the
// header a message leaves with (sender, receiver, job, sequence number for PS_RESEND),
// its encoding and hand-over to the transport, and send scheduling with its credit
// (PSKV_WIRE_WINDOW_BYTES: big data messages wait in a per-destination window and
// priority queue, ps/send_schedule.h; the receiver credits them on arrival, kCredit).
//
// It acts through its Node (the transport, the resender, the node's id and job, the
// failure and log names): it is part of the node's protocol, not an independent layer.
//
// Lock rule: its members (the schedule) are guarded by the Node's mutex (Node::mu_),
// as the Node's own are; each method says whether it is called with that mutex held
// ("mu_ held") or takes it itself ("no lock held"). Threads: the application's and the
// data handler's (Data), the receive thread (credits, control replies), the timer
// thread (heartbeats, registration), each under mu_.
#pragma once

#include <cstdint>
#include <string>

#include "protocol/message.h"
#include "ps/send_schedule.h"

namespace pskv {

class Node;

class SendPath {
 public:
  /// `window_bytes`: PSKV_WIRE_WINDOW_BYTES (<= 0: nothing is scheduled).
  SendPath(Node& node, int64_t window_bytes) : n_(node), schedule_(window_bytes) {}

  /// No lock held: a data message to `to` (Node::Send), scheduled when it is big.
  /// Throws the job's failure if one was detected.
  void Data(int to, Message m);
  /// mu_ held: fills in the header of `m` and sends it to `to` (tracked for resend
  /// when its kind is resent).
  void SendFrames(int to, Message& m);
  /// mu_ held: a control message.
  void SendControl(int to, Control c, int head = 0, std::string body = {}, uint64_t ts = 0);
  /// mu_ held: a kCredit from `sender` saying it received `count` scheduled messages;
  /// sends what the window now has room for.
  void OnCredit(int sender, uint64_t count);
  /// mu_ held, receiver side: acknowledges one more scheduled message from `sender`.
  void Credit(int sender);
  /// mu_ held: forgets peer `id` (it is gone): its queue, window and credits.
  void Forget(int id) { schedule_.Forget(id); }
  /// mu_ held: the job failed; queued sends fail with their requests.
  void DropQueues() { schedule_.DropQueues(); }

 private:
  /// Whether messages of kind `c` are sequenced, acknowledged and resent (PS_RESEND).
  bool Resendable(Control c) const;

  Node& n_;
  SendSchedule schedule_;
};

}  // namespace pskv
