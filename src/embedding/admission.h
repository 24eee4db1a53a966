// Admission of new ids into an embedding table: an id gets a row only once it was
// seen `admit_after` times (DeepRec's CounterFilter / CBFFilter, Monolith's
// occurrence_threshold).
//
//  * kExact: a counter per id not yet admitted (an IdMap entry, 16 bytes / 0.75 load
//    at most); an id admitted leaves it, an id not seen for the table's ttl_steps is
//    forgotten at the TTL sweep (bounded by the ids of one TTL window).
//  * kCountingBloom: `cbf_counters` 8-bit counters, `cbf_hashes` positions per id
//    (double hashing of a 64-bit mix), conservative update (only the smallest of an
//    id's counters are incremented), estimate = the smallest: never below the true
//    count, above it with the false-positive rate of a Bloom filter of the same size,
//    (1 - e^{-k n / m})^k for n distinct ids (CbfFalsePositiveRate). Fixed memory,
//    never forgets (size it for the ids of the job); counters saturate at 255, so
//    admit_after <= 255.
// Changes since the last checkpoint (for deltas that scale with what changed): while
// tracking is on (the table has a delta chain), the exact counter's ids whose count
// changed or that left it, and the counting Bloom filter's counters that changed, are
// recorded (a set of ids; a bitmap of m bits plus the list of changed positions).
// Not thread-safe (one shard, one thread).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "embedding/id_map.h"
#include "pskv/embedding.h"

namespace pskv::embedding {

/// The admission settings (include/pskv/embedding.h).
using AdmissionConfig = pskv::EmbeddingAdmission;

/// (1 - e^{-k n / m})^k: the probability that an id never seen reads as seen once
/// after n distinct ids were counted in m counters with k hashes.
double CbfFalsePositiveRate(uint64_t m, uint32_t k, uint64_t n);

class Admission {
 public:
  explicit Admission(const AdmissionConfig& cfg);
  bool enabled() const { return cfg_.admit_after > 1; }
  const AdmissionConfig& config() const { return cfg_; }

  /// Sightings of `id` so far (the CBF: an estimate, never below the truth).
  uint32_t Count(uint64_t id) const;
  /// Counts `times` more sightings of `id` at `step`.
  void Add(uint64_t id, uint32_t times, int64_t step);
  /// `id` got its row: the exact counter forgets it; the CBF keeps its counts.
  void Admitted(uint64_t id);
  /// The exact counter forgets ids not seen since `now - ttl` (ttl > 0).
  void Expire(int64_t now, int64_t ttl);
  size_t pending() const { return exact_.size(); }
  uint64_t bytes() const {
    return exact_.bytes() + cbf_.size() + changed_.bytes() + cbf_marks_.size() * 8 +
           cbf_changed_.capacity() * 8;
  }
  /// Starts (clearing what was recorded) or stops recording changes.
  void Track(bool on);
  bool tracking() const { return tracking_; }
  /// Forgets the changes recorded so far (a checkpoint holds them now).
  void ClearChanges();
  /// The exact counter's ids changed (counted, admitted or forgotten) since the last
  /// ClearChanges; each is in exact() now (count changed) or not (it left).
  const IdMap& changed_ids() const { return changed_; }
  /// The counting Bloom filter's positions changed since the last ClearChanges.
  const std::vector<uint64_t>& changed_counters() const { return cbf_changed_; }

  // For checkpoints (table_io.cc).
  const IdMap& exact() const { return exact_; }
  const std::vector<uint8_t>& cbf() const { return cbf_; }
  void Restore(IdMap exact, std::vector<uint8_t> cbf);
  void Clear();

 private:
  void Positions(uint64_t id, uint64_t* pos) const;
  void Changed(uint64_t id);
  void CounterChanged(uint64_t pos);
  AdmissionConfig cfg_;
  IdMap exact_;               // id -> a: count, b: low 32 bits of the last step seen
  std::vector<uint8_t> cbf_;  // kCountingBloom
  bool tracking_ = false;
  IdMap changed_;                      // exact: ids changed since the last checkpoint
  std::vector<uint64_t> cbf_marks_;    // CBF: a bit per counter, set once changed
  std::vector<uint64_t> cbf_changed_;  // CBF: the changed positions
};

}  // namespace pskv::embedding
