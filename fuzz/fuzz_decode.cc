// libFuzzer target for the message decoder. Input format: a sequence of frames,
// each a little-endian uint16 length followed by that many bytes (so the fuzzer
// can produce any framing). Decode must either succeed or throw ProtocolError;
// on success, every accessor is exercised within the validated sizes. The whole
// input is also decoded as a control payload (protocol/payload.h and
// kvstore/distributed/wire/kv_payload.h), whose first byte (the payload kind)
// chooses the decoder; it too must succeed or throw ProtocolError. So must the whole input as a
// path control message (transport/upgrade/control_codec.h) and each path's offer details, and as
// every body servers send each other (kvstore/distributed/wire/replication_wire.h; those of a
// message with keys for 0 to 3 keys).
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kvstore/distributed/wire/kv_payload.h"
#include "kvstore/distributed/wire/replication_wire.h"
#include "protocol/message.h"
#include "pskv/error.h"
#include "transport/shm/ring_path.h"
#include "transport/tcp/socket_path.h"
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
      if (o->path == up::PathKind::kRing) (void)pskv::shm::DecodeRingDetails(o->details);
      if (o->path == up::PathKind::kTcp) (void)pskv::direct::DecodeTcpDetails(o->details);
    }
  } catch (const pskv::ProtocolError&) {
  }
  for (auto* decode : {+[](const std::string& s) { (void)pskv::shm::DecodeRingDetails(s); },
                       +[](const std::string& s) { (void)pskv::direct::DecodeTcpDetails(s); }}) {
    try {
      decode(whole);
    } catch (const pskv::ProtocolError&) {
    }
  }
  {
    namespace rw = pskv::dist::replication_wire;
    auto attempt = [](auto&& parse) {
      try {
        parse();
      } catch (const pskv::ProtocolError&) {
      }
    };
    attempt([&] { (void)rw::ParseVersion(whole); });
    attempt([&] { (void)rw::ParseRound(whole); });
    attempt([&] { (void)rw::RoundAgain(whole, 7); });
    attempt([&] { (void)rw::ParseSparseRound(whole); });
    attempt([&] { (void)rw::ParseCopyHead(whole); });
    attempt([&] { (void)rw::ParseCopyBegin(whole); });
    attempt([&] { (void)rw::ParseCopyStates(whole); });
    attempt([&] { rw::ParseCopyEnd(whole); });
    for (uint64_t n = 0; n <= 3; ++n) {
      attempt([&] { (void)rw::ParseAsyncPushes(whole, n); });
      attempt([&] { (void)rw::ParseForwardedInit(whole, n); });
      attempt([&] { (void)rw::ParseCopyKeys(whole, n); });
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
