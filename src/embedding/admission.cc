#include "embedding/admission.h"

#include <algorithm>
#include <cmath>

#include "pskv/error.h"

namespace pskv {

EmbeddingAdmission EmbeddingAdmission::CountingBloom(uint32_t admit_after, uint64_t distinct_ids,
                                                     double fpr) {
  if (distinct_ids == 0 || !(fpr > 0 && fpr < 1))
    throw InvalidArgument("counting Bloom filter: distinct_ids must be > 0 and fpr in (0, 1)");
  const double ln2 = std::log(2.0);
  const double n = static_cast<double>(distinct_ids);
  EmbeddingAdmission c;
  c.mode = Mode::kCountingBloom;
  c.admit_after = admit_after;
  c.cbf_counters = static_cast<uint64_t>(std::ceil(-n * std::log(fpr) / (ln2 * ln2)));
  c.cbf_hashes = static_cast<uint32_t>(
      std::max(1.0, std::round(static_cast<double>(c.cbf_counters) / n * ln2)));
  return c;
}

}  // namespace pskv

namespace pskv::embedding {

double CbfFalsePositiveRate(uint64_t m, uint32_t k, uint64_t n) {
  return std::pow(
      1 - std::exp(-static_cast<double>(k) * static_cast<double>(n) / static_cast<double>(m)),
      static_cast<double>(k));
}

Admission::Admission(const AdmissionConfig& cfg) : cfg_(cfg) {
  if (cfg_.mode == AdmissionConfig::Mode::kCountingBloom && enabled()) {
    if (cfg_.admit_after > 255)
      throw InvalidArgument("admission.admit_after is " + std::to_string(cfg_.admit_after) +
                            " but a counting Bloom filter counts to 255: use at most 255, or "
                            "the exact counter (admission.mode = exact)");
    if (cfg_.cbf_counters < 64 || cfg_.cbf_counters > (uint64_t{1} << 40) || cfg_.cbf_hashes < 1 ||
        cfg_.cbf_hashes > 16)
      throw InvalidArgument(
          "admission: cbf_counters must be in [64, 2^40] and cbf_hashes in [1, 16] (got " +
          std::to_string(cfg_.cbf_counters) + ", " + std::to_string(cfg_.cbf_hashes) +
          "); AdmissionConfig::CountingBloom sizes them from the ids and a false-positive rate");
    cbf_.assign(cfg_.cbf_counters, 0);
  }
}

void Admission::Positions(uint64_t id, uint64_t* pos) const {
  // Double hashing (Kirsch & Mitzenmacher): h1 + i*h2, h2 odd.
  const uint64_t h = Mix64(id ^ 0x5bd1e9955bd1e995ULL);
  const uint64_t h1 = h, h2 = Mix64(h) | 1;
  for (uint32_t i = 0; i < cfg_.cbf_hashes; ++i) pos[i] = (h1 + i * h2) % cfg_.cbf_counters;
}

uint32_t Admission::Count(uint64_t id) const {
  if (!enabled()) return 0;
  if (cfg_.mode == AdmissionConfig::Mode::kExact) {
    const IdMap::Entry* e = exact_.Find(id);
    return e ? e->a : 0;
  }
  uint64_t pos[16];
  Positions(id, pos);
  uint8_t m = 255;
  for (uint32_t i = 0; i < cfg_.cbf_hashes; ++i) m = std::min(m, cbf_[pos[i]]);
  return m;
}

void Admission::Add(uint64_t id, uint32_t times, int64_t step) {
  if (!enabled() || times == 0) return;
  if (cfg_.mode == AdmissionConfig::Mode::kExact) {
    bool inserted;
    IdMap::Entry& e = exact_.FindOrInsert(id, &inserted);
    e.a = inserted ? times : e.a + std::min(times, UINT32_MAX - e.a);
    e.b = static_cast<uint32_t>(step);
    Changed(id);
    return;
  }
  uint64_t pos[16];
  Positions(id, pos);
  for (uint32_t t = 0; t < times; ++t) {  // conservative update, one sighting at a time
    uint8_t m = 255;
    for (uint32_t i = 0; i < cfg_.cbf_hashes; ++i) m = std::min(m, cbf_[pos[i]]);
    if (m == 255) return;
    for (uint32_t i = 0; i < cfg_.cbf_hashes; ++i)
      if (cbf_[pos[i]] == m) {
        ++cbf_[pos[i]];
        CounterChanged(pos[i]);
      }
  }
}

void Admission::Admitted(uint64_t id) {
  if (cfg_.mode != AdmissionConfig::Mode::kExact) return;
  if (IdMap::Entry* e = exact_.Find(id)) {
    exact_.Erase(e);
    Changed(id);
  }
}

void Admission::Expire(int64_t now, int64_t ttl) {
  if (cfg_.mode != AdmissionConfig::Mode::kExact || exact_.size() == 0 || ttl <= 0) return;
  std::vector<uint64_t> old;
  const uint32_t now32 = static_cast<uint32_t>(now);
  exact_.ForEach([&](const IdMap::Entry& e) {
    // Ages in 32 bits wrap consistently for any ttl below 2^31 steps.
    if (static_cast<int64_t>(static_cast<uint32_t>(now32 - e.b)) >= ttl) old.push_back(e.id);
  });
  for (uint64_t id : old) {
    exact_.Erase(exact_.Find(id));
    Changed(id);
  }
}

void Admission::Changed(uint64_t id) {
  if (!tracking_) return;
  bool inserted;
  changed_.FindOrInsert(id, &inserted).a = 1;
}

void Admission::CounterChanged(uint64_t pos) {
  if (!tracking_) return;
  uint64_t& word = cbf_marks_[pos / 64];
  const uint64_t bit = uint64_t{1} << (pos % 64);
  if (word & bit) return;
  word |= bit;
  cbf_changed_.push_back(pos);
}

void Admission::Track(bool on) {
  tracking_ = on && enabled();
  changed_.Reset();
  cbf_changed_.clear();
  cbf_changed_.shrink_to_fit();
  if (tracking_ && !cbf_.empty())
    cbf_marks_.assign((cbf_.size() + 63) / 64, 0);
  else
    cbf_marks_.clear();
}

void Admission::ClearChanges() {
  changed_.Reset();
  for (uint64_t pos : cbf_changed_) cbf_marks_[pos / 64] = 0;
  cbf_changed_.clear();
}

void Admission::Restore(IdMap exact, std::vector<uint8_t> cbf) {
  exact_ = std::move(exact);
  if (cfg_.mode == AdmissionConfig::Mode::kCountingBloom && enabled()) cbf_ = std::move(cbf);
}

void Admission::Clear() {
  exact_.Reset();
  std::fill(cbf_.begin(), cbf_.end(), 0);
  Track(false);
}

}  // namespace pskv::embedding
