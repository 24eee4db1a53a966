// StoreType parsing and the store factory registry (pskv/store_type.h).
#include "pskv/store_type.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "kvstore/kvstore_dist.h"
#include "kvstore/kvstore_local.h"
#include "pskv/error.h"
#include "pskv/kvstore.h"

namespace pskv {
namespace {

struct NameEntry {
  const char* name;
  const char* canonical;
};
// Canonical names first (their own entries), then MXNet's aliases.
constexpr NameEntry kNames[] = {
    {"local", "local"},
    {"device", "device"},
    {"dist_sync", "dist_sync"},
    {"dist_async", "dist_async"},
    {"dist_sync_device", "dist_sync_device"},
    {"dist_async_device", "dist_async_device"},
    {"dist", "dist_sync"},
    {"dist_device_sync", "dist_sync_device"},
    {"local_update_cpu", "local"},
    {"local_allreduce_cpu", "local"},
    {"local_allreduce_device", "device"},
};

struct Registry {
  std::mutex mu;
  std::map<std::string, StoreFactory> factories;
};

Registry& Factories() {
  static Registry* r = [] {
    auto* reg = new Registry;  // never destroyed: stores may be created during exit
    auto local = [](const StoreType& t, const Options& o) -> std::unique_ptr<KVStore> {
      return std::make_unique<KVStoreLocal>(t.name, o, t.device);
    };
    auto dist = [](const StoreType& t, const Options& o) { return CreateDistKVStore(t.name, o); };
    reg->factories["local"] = local;
    reg->factories["device"] = local;
    for (const char* d : {"dist_sync", "dist_async", "dist_sync_device", "dist_async_device"})
      reg->factories[d] = dist;
    return reg;
  }();
  return *r;
}

}  // namespace

StoreType StoreType::Parse(std::string_view name) {
  std::string t(name);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const NameEntry& e : kNames) {
    if (t != e.name) continue;
    StoreType st;
    st.canonical = e.canonical;
    st.name = t;
    st.dist = st.canonical.rfind("dist", 0) == 0;
    st.async = st.canonical == "dist_async" || st.canonical == "dist_async_device";
    st.device = st.canonical == "device" || st.canonical == "dist_sync_device" ||
                st.canonical == "dist_async_device";
    return st;
  }
  std::string list;
  for (auto& v : Names()) list += (list.empty() ? "" : ", ") + v;
  throw InvalidArgument("unknown kvstore type '" + std::string(name) + "'; valid types: " + list);
}

std::vector<std::string> StoreType::Names() {
  std::vector<std::string> out;
  for (const NameEntry& e : kNames) out.emplace_back(e.name);
  return out;
}

void RegisterStoreFactory(const std::string& canonical, StoreFactory factory) {
  bool known = false;
  for (const NameEntry& e : kNames) known = known || canonical == e.canonical;
  if (!known || !factory)
    throw InvalidArgument("RegisterStoreFactory: '" + canonical +
                          "' is not a canonical store type (or the factory is empty)");
  Registry& r = Factories();
  std::lock_guard<std::mutex> lk(r.mu);
  r.factories[canonical] = std::move(factory);
}

std::unique_ptr<KVStore> KVStore::Create(const std::string& type, const Options& options) {
  const StoreType st = StoreType::Parse(type);
  StoreFactory f;
  {
    Registry& r = Factories();
    std::lock_guard<std::mutex> lk(r.mu);
    f = r.factories.at(st.canonical);
  }
  return f(st, options);
}

std::vector<std::string> KVStore::ValidTypes() {
  return StoreType::Names();
}

}  // namespace pskv
