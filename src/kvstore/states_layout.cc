#include "kvstore/states_layout.h"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <utility>

#include "pskv/error.h"

namespace pskv::states {

namespace {

// One part of a key with the server's states for it.
struct Found {
  const Part* part;
  const KeyView* view;
};

// A whole key about to be written: its layout and its parts by ascending offset.
struct Whole {
  const KeyLayout* key;
  std::vector<Found> parts;
  int64_t t = 0;
};

std::string Name(int64_t key) {
  return "key " + std::to_string(key);
}

// Checks that the parts' states agree with each other and with the layout: the same
// buffers present, each of its part's length, the parts covering the key.
void CheckParts(const Whole& w) {
  const KeyView& first = *w.parts.front().view;
  int64_t at = 0;
  for (const Found& f : w.parts) {
    const Part& p = *f.part;
    const KeyView& v = *f.view;
    if (p.offset != at)
      throw InternalError("optimizer states: the parts of " + Name(w.key->key) +
                          " do not cover it");
    at += p.len;
    bool ok = v.slots.size() == first.slots.size() && (v.master.n < 0) == (first.master.n < 0) &&
              (v.master.n < 0 || v.master.n == p.len);
    for (size_t s = 0; ok && s < v.slots.size(); ++s)
      ok = (v.slots[s].n < 0) == (first.slots[s].n < 0) &&
           (v.slots[s].n < 0 || v.slots[s].n == p.len);
    if (!ok)
      throw InternalError("optimizer states: server " + std::to_string(p.server) + "'s part of " +
                          Name(w.key->key) + " (optimizer key " + std::to_string(p.opt_key) + ", " +
                          std::to_string(p.len) +
                          " elements) does not match its other parts or its size");
  }
  if (at != w.key->size)
    throw InternalError("optimizer states: the parts of " + Name(w.key->key) + " do not cover it");
}

// Writes one array of a whole key from its parts (`pick` gives a part's view).
template <typename Pick>
void WriteWhole(BlobWriter& w, const Whole& k, Pick pick) {
  if (pick(*k.parts.front().view).n < 0) return w.ArrayHead(-1);
  w.ArrayHead(k.key->size);
  for (const Found& f : k.parts) {
    const ArrayView& a = pick(*f.view);
    w.Bytes(a.data, static_cast<size_t>(a.n) * 4);
  }
}

// Checks that every buffer of `v` has one element per element of its key.
void CheckSizes(const KeyView& v, const KeyLayout& k) {
  for (const ArrayView& s : v.slots)
    if (s.n >= 0 && s.n != k.size)
      throw ShapeError("optimizer states: " + Name(v.key) + " has a state of " +
                       std::to_string(s.n) + " elements but the weight has " +
                       std::to_string(k.size) + " (states saved from another model?)");
  if (v.master.n >= 0 && v.master.n != k.size)
    throw ShapeError("optimizer states: " + Name(v.key) + " has a float32 master copy of " +
                     std::to_string(v.master.n) + " elements but the weight has " +
                     std::to_string(k.size) + " (states saved from another model?)");
}

// Bytes of one array of `len` elements in a blob (count + elements).
uint64_t ArrayBytes(const ArrayView& a, int64_t len) {
  return 8 + (a.n < 0 ? 0 : static_cast<uint64_t>(len) * 4);
}

}  // namespace

void GatherWholeKeys(const std::vector<std::string_view>& servers, const Layout& layout,
                     bool dumped, const BlobWriter::Sink& out) {
  std::vector<BlobView> blobs;
  blobs.reserve(servers.size());
  for (std::string_view s : servers) blobs.push_back(IndexBlob(s));
  std::vector<std::unordered_map<int64_t, const KeyView*>> held(blobs.size());
  size_t total = 0;
  int64_t num_update = 0;
  for (size_t s = 0; s < blobs.size(); ++s) {
    for (const KeyView& k : blobs[s].keys) held[s][k.key] = &k;
    total += held[s].size();
    num_update = std::max(num_update, blobs[s].num_update);
  }
  std::vector<Whole> wholes;
  size_t used = 0;
  for (const KeyLayout& k : layout) {
    Whole w{&k, {}, 0};
    for (const Part& p : k.parts) {
      if (p.server < 0 || static_cast<size_t>(p.server) >= held.size())
        throw InternalError("optimizer states: " + Name(k.key) + " placed on server " +
                            std::to_string(p.server) + " of " + std::to_string(held.size()));
      auto it = held[static_cast<size_t>(p.server)].find(p.opt_key);
      if (it != held[static_cast<size_t>(p.server)].end()) w.parts.push_back({&p, it->second});
    }
    if (w.parts.empty()) continue;  // never updated
    if (w.parts.size() != k.parts.size())
      throw InternalError("optimizer states: " + Name(k.key) + " has states on " +
                          std::to_string(w.parts.size()) + " of its " +
                          std::to_string(k.parts.size()) + " parts");
    used += w.parts.size();
    std::sort(w.parts.begin(), w.parts.end(),
              [](const Found& a, const Found& b) { return a.part->offset < b.part->offset; });
    CheckParts(w);
    for (const Found& f : w.parts) w.t = std::max(w.t, f.view->t);
    wholes.push_back(std::move(w));
  }
  if (used != total) {
    // Name one part nobody asked for.
    std::map<std::pair<int, int64_t>, bool> known;
    for (const KeyLayout& k : layout)
      for (const Part& p : k.parts) known[{p.server, p.opt_key}] = true;
    for (size_t s = 0; s < held.size(); ++s)
      for (const auto& [key, view] : held[s])
        if (!known.count({static_cast<int>(s), key}))
          throw InternalError("optimizer states: server " + std::to_string(s) +
                              " holds states of optimizer key " + std::to_string(key) +
                              ", which is no part of a key of this store");
  }
  out(kWholeKeysMagic.data(), kWholeKeysMagic.size());
  BlobWriter w(out);
  w.Head(dumped, blobs.empty() ? std::string() : blobs[0].config, num_update, wholes.size());
  for (const Whole& k : wholes) {
    const KeyView& first = *k.parts.front().view;
    w.Key(k.key->key, k.t, static_cast<uint32_t>(first.slots.size()));
    for (size_t s = 0; s < first.slots.size(); ++s)
      WriteWhole(w, k, [s](const KeyView& v) -> const ArrayView& { return v.slots[s]; });
    WriteWhole(w, k, [](const KeyView& v) -> const ArrayView& { return v.master; });
  }
}

std::vector<uint64_t> SplitWholeKeys(const BlobView& whole, const Layout& layout, int num_servers,
                                     std::string* out) {
  std::unordered_map<int64_t, const KeyLayout*> by_key;
  for (const KeyLayout& k : layout) by_key[k.key] = &k;
  // Each server's parts, and its blob's size.
  std::vector<std::vector<std::pair<const KeyView*, const Part*>>> per(
      static_cast<size_t>(num_servers));
  std::vector<uint64_t> sizes(static_cast<size_t>(num_servers),
                              8 + 4 + whole.config.size() + 8 + 8);
  for (const KeyView& v : whole.keys) {
    auto it = by_key.find(v.key);
    if (it == by_key.end())
      throw KeyError("optimizer states: " + Name(v.key) +
                     " is not a key of this store (states saved from another model?)");
    CheckSizes(v, *it->second);
    for (const Part& p : it->second->parts) {
      if (p.server < 0 || p.server >= num_servers)
        throw InternalError("optimizer states: " + Name(v.key) + " placed on server " +
                            std::to_string(p.server) + " of " + std::to_string(num_servers));
      per[static_cast<size_t>(p.server)].push_back({&v, &p});
      uint64_t& n = sizes[static_cast<size_t>(p.server)];
      n += 8 + 8 + 4 + ArrayBytes(v.master, p.len);
      for (const ArrayView& s : v.slots) n += ArrayBytes(s, p.len);
    }
  }
  uint64_t total = 0;
  for (uint64_t n : sizes) total += n;
  out->reserve(out->size() + total);
  BlobWriter w([out](const char* p, size_t n) { out->append(p, n); });
  auto part_of = [&w](const ArrayView& a, const Part& p) {
    if (a.n < 0) return w.ArrayHead(-1);
    w.ArrayHead(p.len);
    w.Bytes(a.data + static_cast<size_t>(p.offset) * 4, static_cast<size_t>(p.len) * 4);
  };
  for (const auto& parts : per) {
    w.Head(whole.dumped, whole.config, whole.num_update, parts.size());
    for (const auto& [v, p] : parts) {
      w.Key(p->opt_key, v->t, static_cast<uint32_t>(v->slots.size()));
      for (const ArrayView& s : v->slots) part_of(s, *p);
      part_of(v->master, *p);
    }
  }
  return sizes;
}

}  // namespace pskv::states
