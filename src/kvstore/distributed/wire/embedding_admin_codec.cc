// The values of a dist table's administrative requests (embedding_admin_codec.h).
#include "kvstore/distributed/wire/embedding_admin_codec.h"

#include <cstring>

#include "pskv/error.h"

namespace pskv::dist::embedding_admin {

std::string Encode(const Request& r) {
  std::string out(24 + r.path.size(), '\0');
  const auto op = static_cast<uint32_t>(r.op);
  const uint64_t n = r.path.size();
  std::memcpy(out.data(), &op, 4);
  std::memcpy(out.data() + 8, &r.ticket, 8);
  std::memcpy(out.data() + 16, &n, 8);
  if (n) std::memcpy(out.data() + 24, r.path.data(), n);
  return out;
}

Request Decode(const sparse_wire::Source& v) {
  if (v.size < 24 || v.size > 24 + kMaxPath)
    throw InvalidArgument("embedding admin request of " + std::to_string(v.size) +
                          " bytes (24 to " + std::to_string(24 + kMaxPath) + ")");
  char head[24];
  v.copy(0, 24, head);
  uint32_t op = 0, zero = 0;
  uint64_t n = 0;
  Request r;
  std::memcpy(&op, head, 4);
  std::memcpy(&zero, head + 4, 4);
  std::memcpy(&r.ticket, head + 8, 8);
  std::memcpy(&n, head + 16, 8);
  if (op < static_cast<uint32_t>(Op::kStats) || op > static_cast<uint32_t>(Op::kOutcome) || zero)
    throw InvalidArgument("embedding admin request: unknown operation " + std::to_string(op));
  if (n != v.size - 24)
    throw InvalidArgument("embedding admin request: a path of " + std::to_string(n) + " bytes in " +
                          std::to_string(v.size - 24));
  r.op = static_cast<Op>(op);
  const bool wants_path = r.op != Op::kStats && r.op != Op::kOutcome;
  if (wants_path != (n > 0))
    throw InvalidArgument(wants_path ? "embedding admin request without a directory"
                                     : "embedding admin request: a path on an operation that "
                                       "takes none");
  r.path.resize(n);
  if (n) v.copy(24, n, r.path.data());
  if (r.path.find('\0') != std::string::npos)
    throw InvalidArgument("embedding admin request: a NUL byte in the directory");
  return r;
}

}  // namespace pskv::dist::embedding_admin
