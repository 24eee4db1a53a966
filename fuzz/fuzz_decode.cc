// libFuzzer target for the message decoder. Input format: a sequence of frames,
// each a little-endian uint16 length followed by that many bytes (so the fuzzer
// can produce any framing). Decode must either succeed or throw ProtocolError;
// on success, every accessor is exercised within the validated sizes. The whole
// input is also decoded as a control payload (protocol/payload.h), whose first
// byte (the payload kind) chooses the decoder; it too must succeed or throw
// ProtocolError. So must the whole input as a path control message
// (transport/upgrade/control_codec.h) and an offer's details.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "protocol/message.h"
#include "protocol/payload.h"
#include "pskv/error.h"
#include "transport/upgrade/control_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    pskv::payload::DecodeAny(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const pskv::ProtocolError&) {
  }
  const std::string whole(reinterpret_cast<const char*>(data), size);
  try {
    namespace up = pskv::upgrade;
    const up::PathControl c = up::DecodeControl(pskv::Frame::FromString(whole));
    if (const auto* o = std::get_if<up::Offer>(&c)) {
      if (o->path == up::PathKind::kRing) (void)up::DecodeRingDetails(o->details);
      if (o->path == up::PathKind::kTcp) (void)up::DecodeTcpDetails(o->details);
    }
  } catch (const pskv::ProtocolError&) {
  }
  for (auto* decode : {+[](const std::string& s) { (void)pskv::upgrade::DecodeRingDetails(s); },
                       +[](const std::string& s) { (void)pskv::upgrade::DecodeTcpDetails(s); }}) {
    try {
      decode(whole);
    } catch (const pskv::ProtocolError&) {
    }
  }
  std::vector<pskv::Frame> frames;
  size_t pos = 0;
  while (pos + 2 <= size && frames.size() < 64) {
    uint16_t len;
    std::memcpy(&len, data + pos, 2);
    pos += 2;
    len = static_cast<uint16_t>(std::min<size_t>(len, size - pos));
    frames.push_back(pskv::Frame::Copy(data + pos, len));
    pos += len;
  }
  try {
    pskv::Message m = pskv::Decode(std::move(frames));
    uint64_t sum = 0;
    for (uint32_t i = 0; i < m.num_keys(); ++i) sum += m.key_ptr()[i] + m.len_ptr()[i];
    volatile uint64_t sink = sum;
    (void)sink;
    std::string out(m.h.vals_len, '\0');
    m.CopyVals(0, m.h.vals_len, out.data());
    (void)pskv::Describe(m.h);
    if (m.h.control == static_cast<uint8_t>(pskv::Control::kRegister) ||
        m.h.control == static_cast<uint8_t>(pskv::Control::kNodeTable))
      (void)pskv::DecodeNodes(m.body);
  } catch (const pskv::ProtocolError&) {
  }
  return 0;
}
