// Bindings of the profiler (include/kiln/profiler.h) and of custom op libraries
// (include/kiln/custom_op.h).
#include <nanobind/stl/variant.h>

#include "common.h"

namespace kiln::py {

void bind_extensions(nb::module_& m) {
  nb::class_<Profile>(m, "Profile", "What the profiler recorded between start and stop.")
      .def("__len__", [](const Profile& p) { return p.spans.size(); }, "Number of spans.")
      .def("chrome_trace", &Profile::chrome_trace,
           "Chrome trace-event JSON (open in ui.perfetto.dev or chrome://tracing).")
      .def("summary", &Profile::summary, nb::arg("gap_us") = 10.0,
           "Top ops by total time, copies, CPU fallbacks and GPU idle gaps of at least gap_us.")
      .def("html", &Profile::html, "One self-contained HTML page drawing the timeline.")
      .def("save", &Profile::save, nb::arg("path"),
           "Writes html() when path ends in .html, else chrome_trace().")
      .def(
          "ops",
          [](const Profile& p) {
            std::vector<std::string> names;
            for (const ProfileSpan& s : p.spans)
              if (s.kind == SpanKind::op) names.push_back(s.name);
            return names;
          },
          "The op names of the recorded op spans, in order.");
  nb::class_<Profiler>(m, "Profiler", "Records ops, copies, CPU fallbacks and compiles.")
      .def_static("start", &Profiler::start,
                  "Starts recording (ValueError when already on).")
      .def_static("stop", &Profiler::stop, nb::call_guard<nb::gil_scoped_release>(),
                  "Stops recording and returns the Profile (ValueError when not on).")
      .def_static("active", &Profiler::active, "Whether the profiler is recording.");
  m.def("load_op_library", &load_op_library, nb::arg("path"),
        "Loads a shared library of custom ops (kiln::load_op_library): it must export "
        "kiln_register_ops for this ABI version; names already registered are an error.");
  m.def("custom_op_names", &custom_op_names, "Names of the registered custom ops.");
  m.def(
      "custom_op",
      [](const std::string& op, nb::sequence inputs,
         const std::map<std::string, AttrValue>& attrs) {
        std::vector<Tensor> ins;
        for (nb::handle h : inputs) ins.push_back(as_tensor(h, "custom_op's inputs"));
        Attrs a;
        for (const auto& [k, v] : attrs) a.set(k, v);
        const std::vector<Tensor> outs = custom_op(op, ins, a);
        return tensor_list(outs, nb::len(inputs) > 0 ? inputs[0] : nb::handle());
      },
      nb::arg("op"), nb::arg("inputs"), nb::arg("attrs") = std::map<std::string, AttrValue>{},
      "Adds a node of the registered custom op `op` on `inputs`; returns its outputs. "
      "Attributes (bool, int, float, lists of int or float, str, dtype) not given take their "
      "declared defaults.");
}

}  // namespace kiln::py
