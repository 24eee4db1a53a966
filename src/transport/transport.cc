#include "transport/transport.h"

#include <cstring>

#include "pskv/error.h"
#include "transport/shm/shm_transport.h"
#include "transport/zmq/zmq_transport.h"

namespace pskv {

Frame Frame::Copy(const void* p, size_t n) {
  auto buf = std::shared_ptr<char[]>(new char[n ? n : 1]);
  if (n) std::memcpy(buf.get(), p, n);
  Frame f;
  f.data = buf.get();
  f.size = n;
  f.owner = std::shared_ptr<const void>(buf, buf.get());
  return f;
}

Frame Frame::FromString(std::string s) {
  auto str = std::make_shared<std::string>(std::move(s));
  Frame f;
  f.data = str->data();
  f.size = str->size();
  f.owner = str;
  return f;
}

std::unique_ptr<Transport> CreateTransport(const std::string& kind, const TransportConfig& cfg) {
  if (kind == "zmq" || kind.empty()) return CreateZmqTransport(cfg);
  if (kind == "shm") return CreateShmTransport(cfg);
  throw ConfigError("unknown transport '" + kind + "' (DMLC_PS_VAN_TYPE); valid: zmq, shm");
}

}  // namespace pskv
