#include "kvstore/distributed/server/rounds.h"

namespace pskv {

std::string FinishedWithoutPushing(const std::string& key, const std::string& worker,
                                   int64_t round) {
  return key + ": " + worker + " finished the job without pushing round " + std::to_string(round) +
         " while other workers did; in sync mode every worker must push every key equally "
         "often (give every worker the same number of batches)";
}

std::string PushedTwice(const std::string& key, const std::string& worker, int64_t round) {
  return worker + " pushed " + key + " twice in one sync round (round " + std::to_string(round) +
         ")";
}

}  // namespace pskv
