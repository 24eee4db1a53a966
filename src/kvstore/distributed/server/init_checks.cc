// InitChecks: every worker's Init calls checked across workers (init_checks.h).
#include "kvstore/distributed/server/init_checks.h"

#include "kvstore/distributed/wire/kv_payload.h"
#include "pskv/error.h"

namespace pskv {

// Records the keys of an Init call as `sender` saw them (to server 0); the first
// disagreement per key is kept, with its error kind, for CheckInit.
void InitChecks::Report(int sender, const std::string& body, const Names& name) {
  payload::InitReport report = payload::DecodeInitReport(body);
  // Rank 0 could not initialise these keys (the servers refused them).
  for (auto& f : report.failures)
    conflicts_.emplace(f.id, Failure{ErrorKind::kKey, std::move(f.message)});
  for (auto& e : report.entries) {
    const int64_t id = e.id;
    Record rec{std::move(e.name), std::move(e.dtype), std::move(e.shape), sender};
    auto [it, fresh] = reports_.emplace(id, rec);
    if (fresh || conflicts_.count(id)) continue;
    const Record& a = it->second;
    if (a.name != rec.name) {
      conflicts_[id] = {ErrorKind::kKey,
                        "string keys were initialised in a different order: " + name(sender) +
                            " gave id " + std::to_string(id) + " to " + rec.name + " but " +
                            name(a.worker) + " gave it to " + a.name +
                            "; every worker must init string keys in the same order"};
    } else if (a.dtype != rec.dtype || a.shape != rec.shape) {
      conflicts_[id] = {ErrorKind::kShape,
                        "key " + a.name + " was initialised with shape " + rec.shape + " " +
                            rec.dtype + " by " + name(sender) + " but with shape " + a.shape + " " +
                            a.dtype + " by " + name(a.worker) +
                            "; every worker must init a key with the same shape and dtype"};
    }
  }
}

// Fails (the same way for every worker) if the reports for these keys disagreed.
void InitChecks::Check(const std::string& body) const {
  for (int64_t id : payload::DecodeCheckInit(body)) {
    auto it = conflicts_.find(id);
    if (it != conflicts_.end())
      std::rethrow_exception(MakeError(it->second.kind, it->second.message));
  }
}

}  // namespace pskv
