// Checkpoints of a dynamic embedding table: full saves, deltas, restore (also onto
// another shard count) and the export of live rows.
//
// File format (little-endian; docs/embedding.md), written to "<path>.tmp<pid>" and
// renamed once complete, the CRC32C of everything before it at the end:
//   "PSKVEMB1", u32 kind (0 full, 1 delta), u64 lineage (of the full save), u64 seq
//   (0 full, k the k-th delta), u32 shard, u32 shards,
//   i64 width, u8 dtype, u32 slots, str optimizer type,
//   u8 admission mode, u32 admit_after, u64 cbf counters, u32 cbf hashes,
//   i64 step, i64 last sweep, i64 x 6 counters (TableStats: admitted .. pulled_defaults),
//   u64 n, n x (u64 id, u32 count, u32 last step) exact admission counter,
//   u64 n, n bytes counting Bloom filter (all of it, or n = 0 in a delta),
//   u64 n, n x (u64 position, u8 value) counters of the filter (deltas; 0 in a full save),
//   u64 n, n x u64 ids evicted since the previous save (deltas),
//   u64 n, n x (u64 id, i64 last step, i64 t, f32 x width x (1 + slots)) rows,
//   u32 CRC32C.
// A full save holds the whole admission state. A delta holds the rows pushed or
// created since the previous save and only the admission state that changed since
// then: the exact counter's entries that changed (count 0: the id left the counter,
// admitted or forgotten) and the filter's counters that changed, as (position, value)
// pairs, or the whole filter when that is smaller (9 bytes a counter against 1).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>

#include "common/byte_io.h"
#include "common/crc32c.h"
#include "embedding/table.h"
#include "pskv/error.h"

namespace pskv::embedding {

namespace {

constexpr char kMagic[] = "PSKVEMB1";
constexpr char kExportMagic[] = "PSKVEMX1";

// A file written through a temporary name, its CRC32C appended, renamed on Commit.
class FileSink {
 public:
  explicit FileSink(std::string path)
      : path_(std::move(path)), tmp_(path_ + ".tmp" + std::to_string(::getpid())) {
    f_.open(tmp_, std::ios::binary | std::ios::trunc);
    if (!f_)
      throw IOError("cannot write embedding checkpoint '" + path_ + "' (cannot create '" + tmp_ +
                    "'): check the directory exists and is writable");
  }
  ~FileSink() {
    if (!committed_) {
      f_.close();
      std::remove(tmp_.c_str());
    }
  }
  void Bytes(const void* p, size_t n) {
    crc_ = Crc32c(p, n, crc_);
    f_.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
  }
  template <typename T>
  void Put(T v) {
    Bytes(&v, sizeof v);
  }
  void Str(const std::string& s) {
    Put<uint32_t>(static_cast<uint32_t>(s.size()));
    Bytes(s.data(), s.size());
  }
  void Commit() {
    const uint32_t crc = crc_;
    f_.write(reinterpret_cast<const char*>(&crc), 4);
    f_.close();
    if (!f_ || std::rename(tmp_.c_str(), path_.c_str()) != 0)
      throw IOError("cannot write embedding checkpoint '" + path_ +
                    "' (disk full or not writable?); the previous file, if any, is unchanged");
    committed_ = true;
  }

 private:
  std::string path_, tmp_;
  std::ofstream f_;
  uint32_t crc_ = 0;
  bool committed_ = false;
};

IOError Corrupt(const std::string& path, const std::string& why) {
  return IOError("embedding checkpoint '" + path + "' is corrupt: " + why +
                 " (a damaged or cut copy); restore from another copy of it, or from an earlier "
                 "full save and the deltas that follow it (losing the steps after those)");
}

// The file's bytes, its size and checksum checked, the checksum removed.
std::string ReadChecked(const std::string& path, const char* magic) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw IOError("cannot open embedding checkpoint '" + path + "'");
  const auto size = static_cast<uint64_t>(f.tellg());
  f.seekg(0);
  if (size < 12) throw Corrupt(path, "cut short (" + std::to_string(size) + " bytes)");
  std::string b(size, '\0');
  if (!f.read(b.data(), static_cast<std::streamsize>(size)))
    throw IOError("cannot read embedding checkpoint '" + path + "'");
  uint32_t saved;
  std::memcpy(&saved, b.data() + size - 4, 4);
  b.resize(size - 4);
  if (Crc32c(b.data(), b.size()) != saved)
    throw Corrupt(path, "its checksum does not match its content (cut short or damaged)");
  if (std::memcmp(b.data(), magic, 8) != 0)
    throw IOError("'" + path + "' is not a pskv embedding " +
                  (magic == kMagic ? std::string("checkpoint") : std::string("export")) +
                  " (bad magic)");
  return b;
}

struct Parsed {
  uint32_t kind = 0;
  uint64_t lineage = 0, seq = 0;
  uint32_t shard = 0, shards = 1;
  int64_t width = 0;
  uint8_t dtype = 0;
  uint32_t slots = 0;
  std::string opt_type;
  uint8_t adm_mode = 0;
  uint32_t admit_after = 0;
  uint64_t cbf_counters = 0;
  uint32_t cbf_hashes = 0;
  int64_t step = 0, last_sweep = 0;
  int64_t counters[6] = {};
  std::vector<IdMap::Entry> exact;                    // in a delta, a == 0: the id left the counter
  std::string_view cbf;                               // the whole filter, or empty in a delta
  std::vector<std::pair<uint64_t, uint8_t>> cbf_set;  // a delta's changed counters
  std::vector<uint64_t> evicted;
  const char* rows = nullptr;
  uint64_t num_rows = 0;
  size_t row_size = 0;  // bytes per saved row
};

Parsed Parse(const std::string& b, const std::string& path) {
  Parsed p;
  try {
    ByteReader r(b.data(), b.size(), "embedding checkpoint");
    r.GetView(8);
    p.kind = r.Get<uint32_t>();
    p.lineage = r.Get<uint64_t>();
    p.seq = r.Get<uint64_t>();
    p.shard = r.Get<uint32_t>();
    p.shards = r.Get<uint32_t>();
    p.width = r.Get<int64_t>();
    p.dtype = r.Get<uint8_t>();
    p.slots = r.Get<uint32_t>();
    p.opt_type = r.GetString(256);
    p.adm_mode = r.Get<uint8_t>();
    p.admit_after = r.Get<uint32_t>();
    p.cbf_counters = r.Get<uint64_t>();
    p.cbf_hashes = r.Get<uint32_t>();
    p.step = r.Get<int64_t>();
    p.last_sweep = r.Get<int64_t>();
    for (int64_t& c : p.counters) c = r.Get<int64_t>();
    if (p.kind > 1 || p.shards == 0 || p.shard >= p.shards || p.width <= 0 ||
        p.width > (int64_t{1} << 20) || p.slots > 3)
      throw Corrupt(path, "its header is out of range");
    const uint64_t ne = r.Get<uint64_t>();
    if (ne > r.remaining() / 16) throw Corrupt(path, "the admission counter is cut short");
    p.exact.resize(ne);
    for (IdMap::Entry& e : p.exact) {
      e.id = r.Get<uint64_t>();
      e.a = r.Get<uint32_t>();
      e.b = r.Get<uint32_t>();
      if (e.a == 0 && p.kind == 0) throw Corrupt(path, "an admission count is zero");
    }
    const uint64_t nc = r.Get<uint64_t>();
    if (nc > r.remaining()) throw Corrupt(path, "the admission filter is cut short");
    p.cbf = std::string_view(r.GetView(nc), nc);
    const uint64_t ns = r.Get<uint64_t>();
    if (ns > r.remaining() / 9) throw Corrupt(path, "the admission filter's changes are cut short");
    if (ns > 0 && (p.kind == 0 || nc > 0))
      throw Corrupt(path, "it holds both a whole admission filter and changes to it");
    p.cbf_set.resize(ns);
    for (auto& [pos, value] : p.cbf_set) {
      pos = r.Get<uint64_t>();
      value = r.Get<uint8_t>();
      if (pos >= p.cbf_counters)
        throw Corrupt(path, "an admission filter position is out of range");
    }
    const uint64_t nv = r.Get<uint64_t>();
    if (nv > r.remaining() / 8) throw Corrupt(path, "the evicted ids are cut short");
    p.evicted.resize(nv);
    if (nv) std::memcpy(p.evicted.data(), r.GetView(nv * 8), nv * 8);
    p.num_rows = r.Get<uint64_t>();
    p.row_size = 24 + 4 * static_cast<size_t>(p.width) * (1 + p.slots);
    if (p.num_rows != r.remaining() / p.row_size || r.remaining() % p.row_size != 0)
      throw Corrupt(path, "its rows do not fill it");
    p.rows = r.GetView(p.num_rows * p.row_size);
  } catch (const ProtocolError& e) {
    throw Corrupt(path, e.what());
  }
  return p;
}

}  // namespace

// ------------------------------------------------------------------------ saving

namespace {
// The header, clocks, counters and admission state: all of it (full save, delta = false)
// or what changed since the previous save (delta).
void WriteHead(FileSink& f, uint32_t kind, uint64_t lineage, uint64_t seq, uint32_t shard,
               uint32_t shards, const TableConfig& cfg, int slots, int64_t step, int64_t last_sweep,
               const TableStats& st, const Admission& adm) {
  const bool delta = kind == 1;
  f.Bytes(kMagic, 8);
  f.Put<uint32_t>(kind);
  f.Put<uint64_t>(lineage);
  f.Put<uint64_t>(seq);
  f.Put<uint32_t>(shard);
  f.Put<uint32_t>(shards);
  f.Put<int64_t>(cfg.width);
  f.Put<uint8_t>(static_cast<uint8_t>(cfg.dtype));
  f.Put<uint32_t>(static_cast<uint32_t>(slots));
  f.Str(cfg.optimizer.type);
  f.Put<uint8_t>(static_cast<uint8_t>(cfg.admission.mode));
  f.Put<uint32_t>(cfg.admission.admit_after);
  f.Put<uint64_t>(cfg.admission.cbf_counters);
  f.Put<uint32_t>(cfg.admission.cbf_hashes);
  f.Put<int64_t>(step);
  f.Put<int64_t>(last_sweep);
  for (int64_t c : {st.admitted, st.evicted_ttl, st.evicted_capacity, st.dropped_grads,
                    st.pulled_rows, st.pulled_defaults})
    f.Put<int64_t>(c);
  // The exact counter in id order: the same content gives the same bytes.
  std::vector<IdMap::Entry> ex;
  if (!delta) {
    ex.reserve(adm.exact().size());
    adm.exact().ForEach([&](const IdMap::Entry& e) { ex.push_back(e); });
  } else {
    ex.reserve(adm.changed_ids().size());
    adm.changed_ids().ForEach([&](const IdMap::Entry& c) {
      const IdMap::Entry* e = adm.exact().Find(c.id);
      ex.push_back(e ? *e : IdMap::Entry{c.id, 0, 0});  // a == 0: it left the counter
    });
  }
  std::sort(ex.begin(), ex.end(),
            [](const IdMap::Entry& x, const IdMap::Entry& y) { return x.id < y.id; });
  f.Put<uint64_t>(ex.size());
  for (const IdMap::Entry& e : ex) {
    f.Put<uint64_t>(e.id);
    f.Put<uint32_t>(e.a);
    f.Put<uint32_t>(e.b);
  }
  // The filter: whole, or its changed counters when 9 bytes each take less.
  const std::vector<uint64_t>& changed = adm.changed_counters();
  if (!delta || changed.size() * 9 >= adm.cbf().size()) {
    f.Put<uint64_t>(adm.cbf().size());
    f.Bytes(adm.cbf().data(), adm.cbf().size());
    f.Put<uint64_t>(0);
  } else {
    std::vector<uint64_t> pos(changed);
    std::sort(pos.begin(), pos.end());
    f.Put<uint64_t>(0);
    f.Put<uint64_t>(pos.size());
    for (uint64_t p : pos) {
      f.Put<uint64_t>(p);
      f.Put<uint8_t>(adm.cbf()[p]);
    }
  }
}
}  // namespace

void Table::SaveFull(const std::string& path, uint32_t shard, uint32_t num_shards) {
  if (num_shards == 0 || shard >= num_shards)
    throw InvalidArgument("SaveFull: shard " + std::to_string(shard) + " of " +
                          std::to_string(num_shards));
  std::random_device rd;
  uint64_t lineage = 0;
  while (lineage == 0) lineage = Mix64((uint64_t{rd()} << 32) ^ rd() ^ lineage_);
  FileSink f(path);
  WriteHead(f, 0, lineage, 0, shard, num_shards, cfg_, slots_, step_, last_sweep_, stats_,
            admission_);
  f.Put<uint64_t>(0);  // no evicted ids
  f.Put<uint64_t>(index_.size());
  const size_t fl = sizeof(float) * static_cast<size_t>(cfg_.width) * (1 + slots_);
  for (uint32_t s = 0; s < top_; ++s) {
    const Head* h = HeadAt(s);
    if (!(h->flags & kLive)) continue;
    f.Put<uint64_t>(h->id);
    f.Put<int64_t>(h->last_step);
    f.Put<int64_t>(h->t);
    f.Bytes(h + 1, fl);
  }
  f.Commit();
  // A new chain: everything is saved.
  for (uint32_t s = 0; s < top_; ++s) HeadAt(s)->flags &= ~kDirty;
  dirty_.clear();
  evicted_.clear();
  admission_.Track(true);
  lineage_ = lineage;
  seq_ = 0;
  saved_shard_ = shard;
  saved_shards_ = num_shards;
}

void Table::SaveDelta(const std::string& path) {
  if (lineage_ == 0)
    throw UsageError("embedding table '" + cfg_.name +
                     "': a delta save needs a full save (or a restore onto the same shard "
                     "count) first: call SaveFull");
  std::vector<uint32_t> rows;
  for (uint32_t s : dirty_) {
    Head* h = HeadAt(s);
    if ((h->flags & (kLive | kDirty)) != (kLive | kDirty)) continue;
    h->flags &= ~kDirty;  // listed once (restored below if the write fails)
    rows.push_back(s);
  }
  std::vector<uint64_t> gone;
  for (uint64_t id : evicted_)
    if (!index_.Find(id)) gone.push_back(id);
  std::sort(gone.begin(), gone.end());
  gone.erase(std::unique(gone.begin(), gone.end()), gone.end());
  try {
    FileSink f(path);
    WriteHead(f, 1, lineage_, seq_ + 1, saved_shard_, saved_shards_, cfg_, slots_, step_,
              last_sweep_, stats_, admission_);
    f.Put<uint64_t>(gone.size());
    f.Bytes(gone.data(), gone.size() * 8);
    f.Put<uint64_t>(rows.size());
    const size_t fl = sizeof(float) * static_cast<size_t>(cfg_.width) * (1 + slots_);
    for (uint32_t s : rows) {
      const Head* h = HeadAt(s);
      f.Put<uint64_t>(h->id);
      f.Put<int64_t>(h->last_step);
      f.Put<int64_t>(h->t);
      f.Bytes(h + 1, fl);
    }
    f.Commit();
  } catch (...) {
    for (uint32_t s : rows) HeadAt(s)->flags |= kDirty;  // nothing lost: the next delta has them
    throw;
  }
  dirty_.clear();
  evicted_.clear();
  admission_.ClearChanges();
  ++seq_;
}

// ------------------------------------------------------------------------ restoring

void Table::PutRow(uint64_t id, int64_t last_step, int64_t t, const float* block) {
  uint32_t slot;
  if (const IdMap::Entry* e = index_.Find(id)) {
    slot = e->a - 1;
  } else {
    slot = AllocSlot();
    bool inserted;
    index_.FindOrInsert(id, &inserted).a = slot + 1;
  }
  Head* h = HeadAt(slot);
  *h = Head{id, last_step, t, kLive, 0};
  std::memcpy(h + 1, block, sizeof(float) * static_cast<size_t>(cfg_.width) * (1 + slots_));
}

void Table::DropRow(uint64_t id) {
  if (const IdMap::Entry* e = index_.Find(id)) FreeRow(e->a - 1);
}

void Table::SwapContent(Table& o) {
  std::swap(chunks_, o.chunks_);
  std::swap(top_, o.top_);
  std::swap(free_, o.free_);
  std::swap(index_, o.index_);
  std::swap(admission_, o.admission_);
  std::swap(step_, o.step_);
  std::swap(last_sweep_, o.last_sweep_);
  std::swap(stats_, o.stats_);
  std::swap(dirty_, o.dirty_);
  std::swap(evicted_, o.evicted_);
  std::swap(lineage_, o.lineage_);
  std::swap(seq_, o.seq_);
  std::swap(saved_shard_, o.saved_shard_);
  std::swap(saved_shards_, o.saved_shards_);
}

// Restore's state and steps: the files of each saved chain are checked and read into
// a new table (tmp), which replaces this one's content only once all were read.
struct Table::Restoring {
  Restoring(Table& self, uint32_t shard, uint32_t num_shards, uint32_t saved_shards)
      : self(self),
        tmp(self.cfg_),
        shard(shard),
        num_shards(num_shards),
        S(saved_shards),
        same(saved_shards == num_shards),
        t("embedding table '" + self.cfg_.name + "': ") {}

  /// Reads saved shard `s`'s chain (its full save, then its deltas).
  void Chain(const SavedShard& chain, uint32_t s);
  /// File k of chain `s` (lineage: the full save's) fits the chain and this table.
  void CheckFile(const Parsed& p, const std::string& path, size_t k, uint32_t s, uint64_t lineage,
                 const std::string& full) const;
  /// A file's rows of this shard, and the ids it evicted.
  void TakeRows(const Parsed& p);
  /// A file's admission state (a full save's, or a delta's changes) into the chain's.
  static void TakeAdmission(const Parsed& p, const std::string& path, IdMap* chain_exact,
                            std::vector<uint8_t>* chain_cbf);
  /// The chain's last file: its clocks and counters; the chain's admission state.
  void EndChain(const Parsed& p, const IdMap& chain_exact, const std::vector<uint8_t>& chain_cbf);
  /// Installs what was read into `self`.
  void Finish();

  Table& self;
  Table tmp;
  const uint32_t shard, num_shards, S;
  const bool same;
  const std::string t;  // the start of messages
  int64_t step = 0, last_sweep = 0;
  IdMap exact;
  std::vector<uint8_t> cbf;
};

void Table::Restoring::Chain(const SavedShard& chain, uint32_t s) {
  std::vector<std::string> files{chain.full};
  files.insert(files.end(), chain.deltas.begin(), chain.deltas.end());
  uint64_t lineage = 0;
  // This chain's admission state: the full save's, then each delta's changes.
  IdMap chain_exact;
  std::vector<uint8_t> chain_cbf;
  for (size_t k = 0; k < files.size(); ++k) {
    const std::string& path = files[k];
    const std::string bytes = ReadChecked(path, kMagic);
    const Parsed p = Parse(bytes, path);
    if (k == 0) lineage = p.lineage;
    CheckFile(p, path, k, s, lineage, chain.full);
    TakeRows(p);
    TakeAdmission(p, path, &chain_exact, &chain_cbf);
    if (k + 1 == files.size()) EndChain(p, chain_exact, chain_cbf);
  }
}

void Table::Restoring::CheckFile(const Parsed& p, const std::string& path, size_t k, uint32_t s,
                                 uint64_t lineage, const std::string& full) const {
  const TableConfig& cfg = self.cfg_;
  if (k == 0 && p.kind != 0)
    throw IOError("'" + path + "' is delta " + std::to_string(p.seq) +
                  ", not a full save: pass each shard's full save first, then its deltas "
                  "in order");
  if (k > 0 && p.kind != 1)
    throw IOError("'" + path + "' is a full save where delta " + std::to_string(k) +
                  " was expected: pass one full save per shard, then its deltas");
  if (p.shard != s || p.shards != S)
    throw IOError("'" + path + "' is shard " + std::to_string(p.shard) + " of " +
                  std::to_string(p.shards) + " but was passed as shard " + std::to_string(s) +
                  " of " + std::to_string(S) +
                  ": pass the files of every saved shard, in shard order");
  if (p.lineage != lineage)
    throw IOError("'" + path + "' is a delta of another full save than '" + full +
                  "': pass the deltas written after that full save");
  if (p.seq != k)
    throw IOError("'" + path + "' is delta " + std::to_string(p.seq) + " where delta " +
                  std::to_string(k) +
                  " was expected: a delta is missing or out of order; pass every delta "
                  "since the full save, in the order written");
  if (p.width != cfg.width)
    throw ShapeError(t + "'" + path + "' holds rows of " + std::to_string(p.width) +
                     " elements but this table's have " + std::to_string(cfg.width) +
                     ": restore into a table of width " + std::to_string(p.width));
  if (p.dtype != static_cast<uint8_t>(cfg.dtype) || p.slots != static_cast<uint32_t>(self.slots_) ||
      p.opt_type != cfg.optimizer.type)
    throw UsageError(t + "'" + path + "' was saved with optimizer '" + p.opt_type + "' (" +
                     std::to_string(p.slots) + " state buffers per row) but this table runs '" +
                     cfg.optimizer.type + "' (" + std::to_string(self.slots_) +
                     "): configure the saved optimizer to restore it");
  if (p.adm_mode != static_cast<uint8_t>(cfg.admission.mode) ||
      (cfg.admission.mode == AdmissionConfig::Mode::kCountingBloom &&
       (p.cbf_counters != cfg.admission.cbf_counters || p.cbf_hashes != cfg.admission.cbf_hashes ||
        (p.cbf.size() != self.admission_.cbf().size() && !(p.kind == 1 && p.cbf.empty())))))
    throw UsageError(t + "'" + path +
                     "' was saved with another admission filter (mode, or counting Bloom "
                     "filter size): configure the saved one to restore it");
}

void Table::Restoring::TakeRows(const Parsed& p) {
  for (uint64_t id : p.evicted) tmp.DropRow(id);
  for (uint64_t r = 0; r < p.num_rows; ++r) {
    const char* at = p.rows + r * p.row_size;
    uint64_t id;
    int64_t ls, tt;
    std::memcpy(&id, at, 8);
    std::memcpy(&ls, at + 8, 8);
    std::memcpy(&tt, at + 16, 8);
    if (ShardOf(id, num_shards) != shard) continue;
    // The block may be unaligned in the file buffer: copy through a float vector.
    std::vector<float> block((p.row_size - 24) / 4);
    std::memcpy(block.data(), at + 24, p.row_size - 24);
    tmp.PutRow(id, ls, tt, block.data());
  }
}

void Table::Restoring::TakeAdmission(const Parsed& p, const std::string& path, IdMap* chain_exact,
                                     std::vector<uint8_t>* chain_cbf) {
  for (const IdMap::Entry& e : p.exact) {
    if (e.a == 0) {  // a delta's: the id left the counter
      if (IdMap::Entry* x = chain_exact->Find(e.id)) chain_exact->Erase(x);
      continue;
    }
    bool inserted;
    IdMap::Entry& n = chain_exact->FindOrInsert(e.id, &inserted);
    n.a = e.a;
    n.b = e.b;
  }
  if (!p.cbf.empty() || p.kind == 0) chain_cbf->assign(p.cbf.begin(), p.cbf.end());
  for (const auto& [pos, value] : p.cbf_set) {
    if (pos >= chain_cbf->size())
      throw Corrupt(path, "it changes admission filter counters its full save does not have");
    (*chain_cbf)[pos] = value;
  }
}

void Table::Restoring::EndChain(const Parsed& p, const IdMap& chain_exact,
                                const std::vector<uint8_t>& chain_cbf) {
  step = std::max(step, p.step);
  last_sweep = std::max(last_sweep, p.last_sweep);
  chain_exact.ForEach([&](const IdMap::Entry& e) {
    if (ShardOf(e.id, num_shards) != shard) return;
    bool inserted;
    IdMap::Entry& n = exact.FindOrInsert(e.id, &inserted);
    n.a = e.a;
    n.b = e.b;
  });
  if (cbf.size() < chain_cbf.size()) cbf.resize(chain_cbf.size(), 0);
  for (size_t i = 0; i < chain_cbf.size(); ++i)  // shards' filters summed (saturating)
    cbf[i] = static_cast<uint8_t>(std::min(255, cbf[i] + chain_cbf[i]));
  if (!same) return;
  TableStats& st = tmp.stats_;
  st.admitted = p.counters[0];
  st.evicted_ttl = p.counters[1];
  st.evicted_capacity = p.counters[2];
  st.dropped_grads = p.counters[3];
  st.pulled_rows = p.counters[4];
  st.pulled_defaults = p.counters[5];
  tmp.lineage_ = p.lineage;
  tmp.seq_ = p.seq;
  tmp.saved_shard_ = shard;
  tmp.saved_shards_ = num_shards;
}

void Table::Restoring::Finish() {
  if (!same) tmp.stats_.admitted = static_cast<int64_t>(tmp.index_.size());
  tmp.step_ = step;
  tmp.last_sweep_ = last_sweep;
  tmp.admission_.Restore(std::move(exact), std::move(cbf));
  // Restored rows are saved already (same chain) or need a full save (new shards).
  for (uint32_t s = 0; s < tmp.top_; ++s) tmp.HeadAt(s)->flags &= ~kDirty;
  tmp.dirty_.clear();
  tmp.evicted_.clear();
  self.SwapContent(tmp);
  self.admission_.Track(self.lineage_ != 0);  // a chain continues: record changes from here
}

void Table::Restore(const std::vector<SavedShard>& saved, uint32_t shard, uint32_t num_shards) {
  if (saved.empty() || num_shards == 0 || shard >= num_shards)
    throw InvalidArgument("embedding table '" + cfg_.name +
                          "': Restore needs the files of at least one saved shard and shard < "
                          "num_shards");
  const auto S = static_cast<uint32_t>(saved.size());
  Restoring r(*this, shard, num_shards, S);
  if (r.same) {
    r.Chain(saved[shard], shard);
  } else {
    for (uint32_t s = 0; s < S; ++s) r.Chain(saved[s], s);
  }
  r.Finish();
}

// ------------------------------------------------------------------------ export

void Table::ExportRows(const std::string& path) const {
  FileSink f(path);
  f.Bytes(kExportMagic, 8);
  f.Put<int64_t>(cfg_.width);
  f.Put<uint64_t>(index_.size());
  const size_t vb = sizeof(float) * static_cast<size_t>(cfg_.width);
  for (uint32_t s = 0; s < top_; ++s) {
    const Head* h = HeadAt(s);
    if (!(h->flags & kLive)) continue;
    f.Put<uint64_t>(h->id);
    f.Bytes(h + 1, vb);
  }
  f.Commit();
}

void ReadExportFile(const std::string& path,
                    const std::function<void(uint64_t, const float*, int64_t)>& fn) {
  const std::string b = ReadChecked(path, kExportMagic);
  if (b.size() < 24) throw Corrupt(path, "cut short");
  int64_t width;
  uint64_t n;
  std::memcpy(&width, b.data() + 8, 8);
  std::memcpy(&n, b.data() + 16, 8);
  if (width <= 0 || width > (int64_t{1} << 20)) throw Corrupt(path, "its width is out of range");
  const size_t rb = 8 + 4 * static_cast<size_t>(width);
  if ((b.size() - 24) % rb != 0 || n != (b.size() - 24) / rb)
    throw Corrupt(path, "its rows do not fill it");
  std::vector<float> v(static_cast<size_t>(width));
  for (uint64_t i = 0; i < n; ++i) {
    const char* at = b.data() + 24 + i * rb;
    uint64_t id;
    std::memcpy(&id, at, 8);
    std::memcpy(v.data(), at + 8, rb - 8);
    fn(id, v.data(), width);
  }
}

}  // namespace pskv::embedding
