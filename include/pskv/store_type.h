// StoreType: a KVStore type name parsed once (MXNet's names and aliases), and the
// registry of store factories that KVStore::Create consults. Every question about a
// type ("is it distributed?", "async?", "does it reduce on the devices?") is answered
// here, never by matching substrings of the name elsewhere.
//
//   name                     scope  mode   reduces on
//   local                    local  sync   CPU   (aliases local_update_cpu, local_allreduce_cpu)
//   device                   local  sync   devices (alias local_allreduce_device)
//   dist_sync (dist)         dist   sync   CPU
//   dist_async               dist   async  CPU
//   dist_sync_device         dist   sync   devices (alias dist_device_sync)
//   dist_async_device        dist   async  devices
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace pskv {

class KVStore;
struct Options;

struct StoreType {
  /// The canonical name: local, device, dist_sync, dist_async, dist_sync_device,
  /// dist_async_device.
  std::string canonical;
  /// The name as given, lower-cased (KVStore::Type() returns it, as MXNet's kv.type).
  std::string name;
  bool dist = false;
  bool async = false;
  /// Reduces (and, with an optimizer, updates) on the devices of the values.
  bool device = false;

  /// Case-insensitive; InvalidArgument listing the valid names otherwise.
  static StoreType Parse(std::string_view name);
  /// Every accepted name, canonical ones first, then the aliases.
  static std::vector<std::string> Names();
};

/// Makes a store of a parsed type.
using StoreFactory =
    std::function<std::unique_ptr<KVStore>(const StoreType& type, const Options& options)>;
/// Installs the factory of canonical type `canonical` (replacing any). The built-in
/// stores register themselves; a new kind of store (a device runtime, a test double)
/// plugs in here. InvalidArgument for a name that is not canonical.
void RegisterStoreFactory(const std::string& canonical, StoreFactory factory);

}  // namespace pskv
