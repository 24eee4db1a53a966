// Keys of a binding call: a Python list of ints or of strs, converted and checked.
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <vector>

namespace pskv::binding {

namespace py = pybind11;

// Keys arrive as a list of ints or a list of strs. They are converted while the
// GIL is held (converting after releasing it crashed on a bad key) and int keys
// are range-checked here: a Python int can exceed the C++ int.
struct Keys {
  bool str = false;
  std::vector<int> ints;
  std::vector<std::string> strs;
};

/// The keys of `keys` (GIL held); KeyError for mixed, non-int/str or out-of-range keys.
Keys ToKeys(const py::list& keys);

/// Calls f(keys.strs) or f(keys.ints).
template <typename F>
void WithKeys(const Keys& keys, F&& f) {
  if (keys.str) {
    f(keys.strs);
  } else {
    f(keys.ints);
  }
}

// Keys `a` then `b` (a pushpull's push and pull keys).
Keys Concat(Keys a, const Keys& b);

}  // namespace pskv::binding
