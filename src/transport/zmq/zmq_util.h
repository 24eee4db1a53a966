// Small ZeroMQ helpers shared by the ZeroMQ backend's parts (zmq_transport.cc,
// guard.cc). Not part of any API.
#pragma once

#include <zmq.h>

#include <string>

namespace pskv::zmqu {

inline std::string Err() {
  return zmq_strerror(zmq_errno());
}
inline void SetInt(void* sock, int opt, int v) {
  zmq_setsockopt(sock, opt, &v, sizeof v);
}
inline void SetStr(void* sock, int opt, const std::string& v) {
  zmq_setsockopt(sock, opt, v.data(), v.size());
}
inline std::string MsgString(zmq_msg_t* m) {
  return std::string(static_cast<const char*>(zmq_msg_data(m)), zmq_msg_size(m));
}
// Receives the remaining parts of a multipart message and drops them.
inline void Drain(void* sock) {
  int more = 1;
  size_t len = sizeof more;
  zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &len);
  while (more) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, sock, 0) < 0 && zmq_errno() != EINTR) {
      zmq_msg_close(&m);
      return;
    }
    more = zmq_msg_more(&m);
    zmq_msg_close(&m);
  }
}

}  // namespace pskv::zmqu
