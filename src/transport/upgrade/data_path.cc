// The registry of data paths (data_path.h): each path registers itself, so the
// negotiator names none of them.
#include "transport/upgrade/data_path.h"

#include <algorithm>
#include <mutex>

#include "pskv/error.h"

namespace pskv::upgrade {

namespace {
struct Entry {
  PathKind kind;
  const char* name;
  const char* label;
  int preference;
  DataPathCreator create;
};
struct Registry {
  std::mutex mu;
  std::vector<Entry> paths;  // in order of preference
};
// Function-local: paths register from static initializers of other files, whose
// order relative to this one is unspecified.
Registry& TheRegistry() {
  static Registry* r = new Registry;  // never destroyed: transports may close at exit
  return *r;
}
}  // namespace

bool RegisterDataPath(PathKind kind, const char* name, const char* label, int preference,
                      DataPathCreator create) {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> g(r.mu);
  for (const Entry& e : r.paths)
    if (e.kind == kind)
      throw InternalError(std::string("data path ") + e.label + " registered twice");
  auto at = std::find_if(r.paths.begin(), r.paths.end(),
                         [&](const Entry& e) { return e.preference > preference; });
  r.paths.insert(at, Entry{kind, name, label, preference, std::move(create)});
  return true;
}

std::vector<std::unique_ptr<DataPath>> CreateDataPaths(const PathHost& host) {
  std::vector<DataPathCreator> creators;
  {
    Registry& r = TheRegistry();
    std::lock_guard<std::mutex> g(r.mu);
    for (const Entry& e : r.paths) creators.push_back(e.create);
  }
  std::vector<std::unique_ptr<DataPath>> out;
  for (auto& create : creators) out.push_back(create(host));
  return out;
}

const char* DataPathName(PathKind kind) {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> g(r.mu);
  for (const Entry& e : r.paths)
    if (e.kind == kind) return e.name;
  return "zmq";
}

const char* PathName(PathKind kind) {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> g(r.mu);
  for (const Entry& e : r.paths)
    if (e.kind == kind) return e.label;
  return "unknown path";
}

}  // namespace pskv::upgrade
