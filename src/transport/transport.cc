#include "transport/transport.h"

#include <map>
#include <mutex>
#include <string>

#include "pskv/error.h"

namespace pskv {

namespace {
struct Registry {
  std::mutex mu;
  std::map<std::string, TransportCreator> kinds;
};
// Function-local: backends register from static initializers of other files,
// whose order relative to this one is unspecified.
Registry& TheRegistry() {
  static Registry* r = new Registry;  // never destroyed: creators may run at exit
  return *r;
}
}  // namespace

bool RegisterTransport(const std::string& kind, TransportCreator create) {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> g(r.mu);
  if (!r.kinds.emplace(kind, std::move(create)).second)
    throw InternalError("transport kind '" + kind + "' registered twice");
  return true;
}

std::vector<std::string> TransportKinds() {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> g(r.mu);
  std::vector<std::string> out;
  for (const auto& [kind, create] : r.kinds) out.push_back(kind);
  return out;
}

std::unique_ptr<Transport> CreateTransport(const std::string& kind, const TransportConfig& cfg) {
  TransportCreator create;
  {
    Registry& r = TheRegistry();
    std::lock_guard<std::mutex> g(r.mu);
    auto it = r.kinds.find(kind.empty() ? std::string("zmq") : kind);
    if (it != r.kinds.end()) create = it->second;
  }
  if (!create) {
    std::string valid;
    for (const std::string& k : TransportKinds()) valid += (valid.empty() ? "" : ", ") + k;
    throw ConfigError("unknown transport '" + kind + "'; valid: " + valid);
  }
  return create(cfg);
}

}  // namespace pskv
