// Helpers shared by the local and the dist store.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "pskv/error.h"
#include "pskv/ndarray.h"

namespace pskv {

/// Groups parallel (key, array) lists by key: ascending keys, arrays of one key in
/// the order given (MXNet's grouping of key/value lists).
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

/// Checks an Init call's keys before anything is created: none exists already
/// (`exists(key)`), none repeats within the call, no value is empty, and with
/// gradient compression every value is float32.
template <typename Exists, typename Name>
void CheckNewKeys(const std::vector<int>& keys, const std::vector<NDArray>& values,
                  bool compressing, Exists&& exists, Name&& name) {
  for (size_t i = 0; i < keys.size(); ++i) {
    if (exists(keys[i])) throw KeyError("duplicate init of key " + name(keys[i]));
    for (size_t j = 0; j < i; ++j)
      if (keys[j] == keys[i])
        throw KeyError("duplicate init of key " + name(keys[i]) + " within one Init call");
    if (values[i].empty() && values[i].shape().empty())
      throw InvalidArgument("Init of key " + name(keys[i]) + " with an empty NDArray");
    if (compressing && values[i].dtype() != DType::kFloat32)
      throw UsageError("Gradient compression is only supported for float32 parameters; key " +
                       name(keys[i]) + " is " + DTypeName(values[i].dtype()));
  }
}

/// The storage-type rules of row_sparse keys (MXNet's, stated in the message).
inline UsageError DenseUseOfSparseKey(const std::string& op, const std::string& key_name) {
  return UsageError(op + " of key " + key_name +
                    ": the key is row_sparse; MXNet's rule: a row_sparse value is read with "
                    "row_sparse_pull (RowSparsePull(key, outs, row_ids)) and pushed as a "
                    "RowSparseNDArray, never as a dense array");
}
inline UsageError SparseUseOfDenseKey(const std::string& op, const std::string& key_name) {
  return UsageError(op + " of key " + key_name +
                    ": the key is dense (storage type default); MXNet's rule: all values of a "
                    "key share one storage type, and row_sparse_pull needs a row_sparse key "
                    "(init it with a RowSparseNDArray)");
}
inline UsageError SparseWithCompression(const std::string& key_name) {
  return UsageError("Init of row_sparse key " + key_name +
                    ": gradient compression for row_sparse storage type is not supported "
                    "(MXNet's rule: compression applies to dense float32 keys only)");
}
/// Checks that a row_sparse value or output matches the key's shape and dtype.
inline void CheckSparseMatches(const Shape& shape, DType dtype, const Shape& want_shape,
                               DType want_dtype, const char* what, const std::string& key_name) {
  if (dtype != want_dtype)
    throw ShapeError(std::string(what) + " for key " + key_name + " has dtype " + DTypeName(dtype) +
                     " but the key was initialised with " + DTypeName(want_dtype));
  if (shape != want_shape)
    throw ShapeError(std::string(what) + " for key " + key_name + " has shape " +
                     ShapeToString(shape) + " but the key was initialised with shape " +
                     ShapeToString(want_shape));
}

}  // namespace pskv
