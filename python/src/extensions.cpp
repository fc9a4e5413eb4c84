// Bindings of features that land separately: the profiler (include/kiln/profiler.h) and custom
// op libraries (kiln::load_op_library). Until they are bound here, the Python names raise
// UnsupportedError (kiln/__init__.py keeps the stand-ins).
#include "common.h"

namespace kiln::py {

void bind_extensions(nb::module_& m) {
  // --- profiler (issue 11): bind kiln::Profiler here (start/stop, Chrome-trace JSON) and drop
  // the stand-in `Profiler` of kiln/__init__.py.
  // --- custom ops (issue 10): bind kiln::load_op_library(path) here as `load_op_library` and drop
  // the stand-in of kiln/__init__.py.
  (void)m;
}

}  // namespace kiln::py
