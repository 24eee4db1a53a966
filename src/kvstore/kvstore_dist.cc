#include "kvstore/kvstore_dist.h"

#include "pskv/error.h"

namespace pskv {

std::unique_ptr<KVStore> CreateDistKVStore(const std::string& type, const Options&) {
  throw UsageError("kvstore type '" + type + "' is not available in this build yet");
}

}  // namespace pskv
