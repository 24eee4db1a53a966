#include "ps/test_disturbance.h"

#include <cstring>

#include "protocol/message.h"
#include "transport/fault/fault_transport.h"

namespace pskv {

std::optional<std::vector<Frame>> ExtraMessageForTests(const WireDisturbance& wire,
                                                       const std::vector<Frame>& frames) {
  if (frames.empty() || frames[0].size != kHeaderSize || frames[0].gathered()) return std::nullopt;
  Header h;
  std::memcpy(&h, frames[0].data, sizeof h);
  const auto c = static_cast<Control>(h.control);
  const bool reply = c == Control::kData && !(h.flags & (kRequest | kCommand | kError));
  if (reply && wire.duplicate_replies) {
    // Its own message: a resend number would make the receiver drop it as a
    // repeat, a window slot would make it credit one more than was sent.
    h.seq = 0;
    h.flags &= static_cast<uint8_t>(~kScheduled);
  } else if (c == Control::kCredit && wire.bogus_credits) {
    h.seq = 0;
    h.timestamp += uint64_t{1} << 40;  // far more than were ever sent
  } else {
    return std::nullopt;
  }
  std::vector<Frame> extra = frames;
  extra[0] = Frame::Copy(&h, sizeof h);
  return extra;
}

std::unique_ptr<Transport> DisturbForTests(std::unique_ptr<Transport> t,
                                           const WireDisturbance& wire) {
  if (!wire.duplicate_replies && !wire.bogus_credits && !wire.cut) return t;
  FaultConfig fc;
  fc.cut = wire.cut;
  fc.also_send = [wire](const std::vector<Frame>& frames) {
    return ExtraMessageForTests(wire, frames);
  };
  return CreateFaultTransport(std::move(t), std::move(fc));
}

}  // namespace pskv
