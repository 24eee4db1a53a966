#include "kvstore/distributed/server/shard_pool.h"

#include <algorithm>
#include <thread>

namespace pskv {

int ShardPoolSize(int requested) {
  if (requested > 0) return requested;
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
}

}  // namespace pskv
