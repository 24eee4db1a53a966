#include "keys.h"

#include <cstdint>

#include "pskv/error.h"

namespace pskv::binding {

Keys ToKeys(const py::list& keys) {
  Keys k;
  k.str = keys.size() > 0 && py::isinstance<py::str>(keys[0]);
  for (const auto& o : keys) {
    if (k.str) {
      if (!py::isinstance<py::str>(o)) throw KeyError("int and str keys mixed in one call");
      k.strs.push_back(o.cast<std::string>());
      continue;
    }
    if (!py::isinstance<py::int_>(o) || py::isinstance<py::bool_>(o))
      throw KeyError("keys must be ints or strs, got " +
                     py::cast<std::string>(py::str(py::type::of(o).attr("__name__"))));
    long long v;
    try {
      v = o.cast<long long>();
    } catch (const py::cast_error&) {
      v = -1;  // beyond 64 bits
    }
    if (v < 0 || v > INT32_MAX)
      throw KeyError("key " + py::cast<std::string>(py::str(o)) +
                     " is out of range: int keys must be in [0, 2147483647]");
    k.ints.push_back(static_cast<int>(v));
  }
  return k;
}

Keys Concat(Keys a, const Keys& b) {
  a.ints.insert(a.ints.end(), b.ints.begin(), b.ints.end());
  a.strs.insert(a.strs.end(), b.strs.begin(), b.strs.end());
  return a;
}

}  // namespace pskv::binding
