// Helpers shared by the local and the dist store.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "pskv/error.h"
#include "pskv/ndarray.h"

namespace pskv {

/// Groups parallel (key, array) lists by key: ascending keys, arrays of one key in
/// the order given (spec 2.3).
inline std::map<int, std::vector<NDArray>> GroupByKey(const std::vector<int>& keys,
                                                      const std::vector<NDArray>& arrays) {
  std::map<int, std::vector<NDArray>> g;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (arrays[i].empty() && arrays[i].size() == 0 && arrays[i].shape().empty())
      throw InvalidArgument("empty NDArray passed for key " + std::to_string(keys[i]));
    g[keys[i]].push_back(arrays[i]);
  }
  return g;
}

/// Checks that `a` matches a key's stored shape and dtype; `what` names the role
/// of `a` ("pushed value", "pull output") and `key_name` the key.
inline void CheckMatches(const NDArray& a, const Shape& shape, DType dtype, const char* what,
                         const std::string& key_name) {
  if (a.dtype() != dtype)
    throw ShapeError(std::string(what) + " for key " + key_name + " has dtype " +
                     DTypeName(a.dtype()) + " but the key was initialised with " +
                     DTypeName(dtype) + "; convert it first");
  if (a.shape() != shape)
    throw ShapeError(std::string(what) + " for key " + key_name + " has shape " +
                     ShapeToString(a.shape()) + " but the key was initialised with shape " +
                     ShapeToString(shape) + " (the size of a key cannot change)");
}

}  // namespace pskv
