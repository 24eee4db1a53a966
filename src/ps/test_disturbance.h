// The disturbances tests ask a node for (FailPoints::Wire, ps/fail_points.h), applied outside the
// node's own code: a FaultTransport (transport/fault) around the node's transport
// that sends extra messages derived from the node's own. The node wraps its
// transport once, at Start, and only when a hook is set, so no message of a
// production node passes a test of a hook.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "common/frame.h"
#include "ps/fail_points.h"
#include "transport/transport.h"

namespace pskv {

/// `t` itself when `wire` asks for nothing on the wire; else `t` wrapped so that
///  * duplicate_replies: every data reply (a server's answer to a KV request) is
///    also sent once more before it — a message of its own for the receiver (no
///    resend number, outside the send window);
///  * bogus_credits: every credit (Control::kCredit) is preceded by one for far
///    more messages than were received, which the peer must drop;
///  * cut: every message to a peer it names is dropped.
std::unique_ptr<Transport> DisturbForTests(std::unique_ptr<Transport> t,
                                           const WireDisturbance& wire);

/// The extra message DisturbForTests sends before `frames` (an encoded message,
/// protocol/message.h), if any.
std::optional<std::vector<Frame>> ExtraMessageForTests(const WireDisturbance& wire,
                                                       const std::vector<Frame>& frames);

}  // namespace pskv
