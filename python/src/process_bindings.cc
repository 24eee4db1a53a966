// The process: its role (DMLC_ROLE), running a server or scheduler role, the table
// of environment variables, and the process-wide settings a program asks for
// (include/pskv/process.h, include/pskv/tuning.h; python/pskv/process.py).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>

#include "binding.h"
#include "common/env_table.h"
#include "common/logging.h"
#include "common/process.h"
#include "pskv/error.h"
#include "pskv/kvstore.h"
#include "pskv/options.h"
#include "pskv/process.h"
#include "pskv/tuning.h"

namespace pskv::binding {

void BindProcess(py::module_& m) {
  m.def("role", [] {
    Options o = Options::FromEnv();
    return o.role_set ? RoleName(o.role) : std::string("worker");
  });
  m.def(
      "run_role",
      [] {
        const Options o = Options::FromEnv();
        std::optional<int> rc;
        {
          py::gil_scoped_release nogil;
          rc = RunServerRoleIfAsked(o);
        }
        if (!rc) throw UsageError("run_role: DMLC_ROLE is neither server nor scheduler");
        return *rc;
      },
      "Runs this process's server/scheduler role until the job ends; returns the exit status.");
  m.def(
      "env_table",
      [] {
        py::list out;
        for (const EnvVar& v : EnvVars()) {
          py::dict d;
          d["name"] = v.name;
          d["type"] = EnvTypeName(v.type);
          d["lo"] = v.lo;
          d["hi"] = v.hi;
          d["choices"] = v.choices;
          d["default"] = v.default_text;
          d["scope"] = EnvScopeName(v.scope);
          d["doc"] = v.doc;
          out.append(d);
        }
        return out;
      },
      "Every environment variable pskv knows (src/common/env_table.cc), as dicts.");
  m.def(
      "configure_process", [] { ConfigureProcess(Options::FromEnv()); },
      "pskv::ConfigureProcess from the environment: log levels and name, timeline, metrics.");
  m.def("tune_allocator", &TuneAllocatorForLargeMessages,
        "pskv::TuneAllocatorForLargeMessages: glibc malloc thresholds for large messages.");
  m.def("allocator_tuned", &AllocatorTuned, "Whether tune_allocator ran in this process.");
  m.def("log_name", &LogName, "The name the process's log lines carry.");
}

}  // namespace pskv::binding
