// The dtype-and-size check every kernel that reads one array into another makes (the
// CPU Reducer and the CUDA runtime): written once, so both refuse the same inputs with
// the same ShapeError.
#pragma once

#include <string>

#include "pskv/error.h"
#include "pskv/ndarray.h"

namespace pskv {

/// Throws ShapeError unless `a` and `dst` have the same dtype and number of elements.
inline void CheckSameLayout(const NDArray& a, const NDArray& dst, const char* what) {
  if (a.dtype() != dst.dtype())
    throw ShapeError(std::string(what) + ": dtype " + DTypeName(a.dtype()) + " differs from " +
                     DTypeName(dst.dtype()));
  if (a.size() != dst.size())
    throw ShapeError(std::string(what) + ": " + std::to_string(a.size()) + " elements where " +
                     std::to_string(dst.size()) + " are expected");
}

}  // namespace pskv
