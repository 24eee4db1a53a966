// InitChecks: what every worker's Init calls looked like, checked across workers
// (kReportInit, kCheckInit; server 0 only receives them).
//
// Each worker reports the keys of an Init call as it saw them (string name, dtype,
// shape); the first report of a key is kept, and the first disagreement per key is
// kept with its error kind. Check then fails the same way for every worker whose keys
// disagreed. Bounded by the number of keys. Not thread-safe: run in the owner's
// exclusive sections (commands).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "kvstore/distributed/server/validate.h"

namespace pskv {

class InitChecks {
 public:
  using Names = std::function<std::string(int)>;
  /// Records `sender`'s report (payload::InitReport, encoded); `name` names a worker
  /// in the messages.
  void Report(int sender, const std::string& body, const Names& name);
  /// Throws the error of the first disagreement among the keys of `body`
  /// (payload::DecodeCheckInit), if any.
  void Check(const std::string& body) const;

 private:
  struct Record {
    std::string name, dtype, shape;
    int worker = 0;
  };
  std::map<int64_t, Record> reports_;     // key id -> first report
  std::map<int64_t, Failure> conflicts_;  // key id -> first disagreement
};

}  // namespace pskv
