// ONNX import (kiln.onnx).
#include <kiln/onnx.h>

#include "common.h"

namespace kiln::py {

namespace {

using SequenceShapes = std::map<std::string, std::vector<std::vector<int64_t>>>;

onnx::ImportOptions import_options(const std::map<std::string, std::vector<int64_t>>& shapes,
                                   nb::handle values, int64_t default_dim,
                                   const std::string& external_data_dir,
                                   const SequenceShapes& sequences = {},
                                   const std::vector<std::string>& absent = {}) {
  onnx::ImportOptions o;
  for (const auto& [k, v] : sequences) {
    auto& elements = o.sequence_inputs[k];  // (an empty sequence too)
    for (const auto& shape : v) elements.push_back(shape);
  }
  o.absent_inputs.insert(absent.begin(), absent.end());
  for (const auto& [k, v] : shapes) o.input_shapes[k] = v;
  if (!values.is_none())
    for (auto [k, v] : as_dict(values, "input_values"))
      o.input_values.emplace(nb::cast<std::string>(k), to_array(v));
  o.default_dim = default_dim;
  o.external_data_dir = external_data_dir;
  return o;
}

// A feed: None is an optional input without a value, a list or tuple of arrays (numpy, kiln or
// anything with __array__, or none) a sequence, anything else an array.
// A numpy array of strings (str, bytes or objects holding them) as a string Value; none for
// any other value.
std::optional<onnx::Value> strings_of(nb::handle v) {
  if (!nb::hasattr(v, "dtype") || !nb::hasattr(v, "shape")) return std::nullopt;
  const std::string kind = nb::cast<std::string>(v.attr("dtype").attr("kind"));
  if (kind != "U" && kind != "S" && kind != "O") return std::nullopt;
  Shape shape;
  for (nb::handle d : v.attr("shape")) shape.push_back(nb::cast<int64_t>(d));
  const nb::object flat = v.attr("reshape")(-1).attr("tolist")();
  const Py_ssize_t n = PyList_GET_SIZE(flat.ptr());
  std::vector<std::string> items(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PyList_GET_ITEM(flat.ptr(), i);  // (borrowed)
    Py_ssize_t size = 0;
    if (PyUnicode_Check(item)) {
      const char* utf8 = PyUnicode_AsUTF8AndSize(item, &size);
      if (!utf8) throw nb::python_error();
      items[static_cast<size_t>(i)].assign(utf8, static_cast<size_t>(size));
    } else if (PyBytes_Check(item)) {
      char* bytes = nullptr;
      if (PyBytes_AsStringAndSize(item, &bytes, &size) != 0) throw nb::python_error();
      items[static_cast<size_t>(i)].assign(bytes, static_cast<size_t>(size));
    } else {
      throw nb::type_error("an object array fed to a session must hold str or bytes");
    }
  }
  return onnx::Value::of_strings(std::move(items), std::move(shape));
}

// A string Value as a numpy array of Python str (dtype object, as ONNX Runtime gives them).
nb::object numpy_strings(const onnx::Value& v) {
  nb::module_ np = nb::module_::import_("numpy");
  nb::object out =
      np.attr("empty")(static_cast<int64_t>(v.strings.size()), nb::arg("dtype") = "object");
  nb::list items = nb::steal<nb::list>(PyList_New(static_cast<Py_ssize_t>(v.strings.size())));
  for (size_t i = 0; i < v.strings.size(); ++i) {
    PyObject* s = PyUnicode_DecodeUTF8(v.strings[i].data(),
                                       static_cast<Py_ssize_t>(v.strings[i].size()), "replace");
    if (!s) throw nb::python_error();
    PyList_SET_ITEM(items.ptr(), static_cast<Py_ssize_t>(i), s);  // (steals s)
  }
  out[nb::slice(nb::none(), nb::none(), nb::none())] = items;
  nb::list shape;
  for (int64_t d : v.string_shape) shape.append(d);
  return out.attr("reshape")(nb::tuple(shape));
}

onnx::Value sequence_or_array(nb::handle v) {
  if (v.is_none()) return onnx::Value::none();
  if (auto s = strings_of(v)) return std::move(*s);
  if (nb::isinstance<nb::list>(v) || nb::isinstance<nb::tuple>(v)) {
    bool arrays = true;
    for (nb::handle item : v)
      arrays = arrays && (nb::isinstance<Array>(item) || nb::hasattr(item, "__array__"));
    if (arrays) {
      std::vector<Array> items;
      for (nb::handle item : v) items.push_back(to_array(item));
      return onnx::Value::of_sequence(std::move(items));
    }
  }
  return onnx::Value::of(to_array(v));
}

}  // namespace

void bind_onnx(nb::module_& m) {
  nb::module_ o = m.def_submodule("onnx", "ONNX import.");
  nb::class_<onnx::ValueInfo>(o, "ValueInfo", nb::dynamic_attr(),
                              "A graph input or output of an imported model.")
      .def_ro("name", &onnx::ValueInfo::name)
      .def_ro("tensor", &onnx::ValueInfo::tensor)
      .def_ro("dtype", &onnx::ValueInfo::dtype)
      .def_ro("shape", &onnx::ValueInfo::shape)
      .def_ro("dim_params", &onnx::ValueInfo::dim_params)
      .def_ro("sequence", &onnx::ValueInfo::sequence,
              "For an element of a sequence input or output ('name[k]'): the sequence's name.")
      .def("__repr__", [](const onnx::ValueInfo& v) {
        return "ValueInfo('" + v.name + "', " + to_string(v.shape) + ", " + name(v.dtype) + ")";
      });
  nb::class_<onnx::GraphOutput>(
      o, "GraphOutput",
      "A graph output as the model declares it: a tensor (outputs[first]), "
      "a sequence (outputs[first:first + count]) or, absent, none.")
      .def_ro("name", &onnx::GraphOutput::name)
      .def_ro("sequence", &onnx::GraphOutput::sequence)
      .def_ro("absent", &onnx::GraphOutput::absent)
      .def_ro("first", &onnx::GraphOutput::first)
      .def_ro("count", &onnx::GraphOutput::count);
  nb::class_<onnx::Model>(o, "Model",
                          "An imported model: a kiln Graph with named inputs and outputs.")
      .def_prop_ro(
          "graph", [](onnx::Model& md) -> Graph& { return md.graph; },
          nb::rv_policy::reference_internal)
      .def_prop_ro(
          "inputs",
          [](nb::handle self) { return value_infos(self, nb::cast<onnx::Model&>(self).inputs); })
      .def_prop_ro(
          "outputs",
          [](nb::handle self) { return value_infos(self, nb::cast<onnx::Model&>(self).outputs); })
      .def_ro("fixed_inputs", &onnx::Model::fixed_inputs)
      .def_ro("graph_outputs", &onnx::Model::graph_outputs,
              "The graph's outputs as declared (tensors, sequences, absent optionals).")
      .def_ro("ir_version", &onnx::Model::ir_version)
      .def_ro("opset", &onnx::Model::opset)
      .def_ro("producer", &onnx::Model::producer)
      .def_ro("parameter_count", &onnx::Model::parameter_count)
      .def_ro("parameter_bytes", &onnx::Model::parameter_bytes)
      .def_ro("op_histogram", &onnx::Model::op_histogram)
      .def("output_tensors",
           [](nb::handle self) {
             return tensor_list(nb::cast<onnx::Model&>(self).output_tensors(), self);
           })
      .def(
          "feed_shapes",
          [](nb::handle self, const std::map<std::string, std::vector<int64_t>>& by_name) {
            nb::dict d;
            for (auto& [t, s] : nb::cast<onnx::Model&>(self).feed_shapes(by_name))
              d[tensor_object(t, self)] = nb::cast(s);
            return d;
          },
          nb::arg("shapes") = std::map<std::string, std::vector<int64_t>>{},
          "{input tensor: shape}, for Graph.compile's feed_shapes.")
      .def(
          "compile",
          [](onnx::Model& md, std::optional<Device> device,
             const std::map<std::string, std::vector<int64_t>>& shapes,
             std::optional<CompileOptions> options) {
            const Device d = device ? *device : default_device();
            nb::gil_scoped_release release;
            return md.graph.compile(d, md.feed_shapes(shapes), md.output_tensors(),
                                    options.value_or(CompileOptions{}));
          },
          nb::arg("device") = nb::none(),
          nb::arg("shapes") = std::map<std::string, std::vector<int64_t>>{},
          nb::arg("options") = nb::none(), nb::keep_alive<0, 1>(),
          "Compiles the model's outputs; run the executable with feeds by input name.");
  o.def(
      "load",
      [](const std::string& path, const std::map<std::string, std::vector<int64_t>>& shapes,
         nb::handle values, int64_t default_dim, const std::string& external_data_dir,
         const SequenceShapes& sequences, const std::vector<std::string>& absent) {
        auto opts =
            import_options(shapes, values, default_dim, external_data_dir, sequences, absent);
        nb::gil_scoped_release release;
        return onnx::import(path, opts);
      },
      nb::arg("path"), nb::arg("input_shapes") = std::map<std::string, std::vector<int64_t>>{},
      nb::arg("input_values") = nb::none(), nb::arg("default_dim") = -1,
      nb::arg("external_data_dir") = "", nb::arg("sequence_inputs") = SequenceShapes{},
      nb::arg("absent_inputs") = std::vector<std::string>{},
      "Imports an ONNX model file (kiln::onnx::import). Raises UnsupportedError listing every "
      "unsupported op. sequence_inputs: {name: [element shape, ...]} for sequence inputs (each "
      "element an input 'name[k]'); absent_inputs: optional inputs without a value.");
  o.def(
      "load_bytes",
      [](nb::bytes data, const std::map<std::string, std::vector<int64_t>>& shapes,
         nb::handle values, int64_t default_dim, const SequenceShapes& sequences,
         const std::vector<std::string>& absent) {
        auto opts = import_options(shapes, values, default_dim, "", sequences, absent);
        return onnx::import_bytes(data.c_str(), data.size(), opts);
      },
      nb::arg("data"), nb::arg("input_shapes") = std::map<std::string, std::vector<int64_t>>{},
      nb::arg("input_values") = nb::none(), nb::arg("default_dim") = -1,
      nb::arg("sequence_inputs") = SequenceShapes{},
      nb::arg("absent_inputs") = std::vector<std::string>{},
      "Imports a serialized ModelProto (arguments as load's).");
  o.def(
      "supported_ops",
      []() {
        std::vector<std::pair<std::string, int>> r;
        for (const auto& s : onnx::supported_ops()) r.emplace_back(s.op_type, s.since_version);
        return r;
      },
      "Every (op type, since version) the importer maps.");
  o.def("is_supported", &onnx::is_supported, nb::arg("op_type"), nb::arg("opset"));
  nb::class_<onnx::Session>(
      o, "Session",
      "An ONNX model that runs any feeds the model allows: inputs whose values kiln needs while "
      "importing (shapes, axes, pads, repeats, trip counts taken as graph inputs) are read from "
      "each run's feeds, and the model is imported and compiled once per distinct set of them. "
      "A node whose outputs' sizes depend on run-time values splits the model there.")
      .def(
          "__init__",
          [](onnx::Session* s, const std::string& path, std::optional<Device> device,
             const std::map<std::string, std::vector<int64_t>>& shapes, nb::handle values,
             std::optional<CompileOptions> options, size_t max_imports, bool split) {
            onnx::SessionOptions so;
            so.import = import_options(shapes, values, -1, "");
            so.compile = options.value_or(CompileOptions{});
            so.max_imports = max_imports;
            so.split_at_data_dependent_nodes = split;
            const Device d = device ? *device : default_device();
            nb::gil_scoped_release release;
            new (s) onnx::Session(path, d, so);
          },
          nb::arg("path"), nb::arg("device") = nb::none(),
          nb::arg("input_shapes") = std::map<std::string, std::vector<int64_t>>{},
          nb::arg("input_values") = nb::none(), nb::arg("options") = nb::none(),
          nb::arg("max_imports") = 8, nb::arg("split_at_data_dependent_nodes") = true)
      .def(
          "run",
          [](const onnx::Session& s, nb::handle feeds) {
            std::map<std::string, onnx::Value> by_name;
            for (auto [k, v] : as_dict(feeds, "feeds"))
              by_name.emplace(nb::cast<std::string>(k), sequence_or_array(v));
            std::vector<onnx::Value> out;
            {
              nb::gil_scoped_release release;
              out = s.run_values(by_name);
            }
            nb::list l;
            for (auto& v : out) {
              if (v.is_none) {
                l.append(nb::none());
                continue;
              }
              if (v.is_string) {
                l.append(numpy_strings(v));
                continue;
              }
              if (!v.is_sequence) {
                l.append(nb::cast(std::move(v.tensor)));
                continue;
              }
              nb::list items;
              for (auto& a : v.sequence) items.append(nb::cast(std::move(a)));
              l.append(items);
            }
            return l;
          },
          nb::arg("feeds"),
          "Runs with {input name: array, a list of arrays for a sequence input, or None for an "
          "optional input without a value}; returns the outputs in order (a list of arrays for a "
          "sequence output, None for an optional output without a value).")
      .def_prop_ro("value_inputs", &onnx::Session::value_inputs,
                   "The inputs whose run-time values select an import.")
      .def_prop_ro("imports", &onnx::Session::imports, "Imports (and compiles) made so far.")
      .def_prop_ro("kept", &onnx::Session::kept, "Imports kept.")
      .def_prop_ro("output_names", &onnx::Session::output_names, "The graph's output names.")
      .def_prop_ro("split", &onnx::Session::split,
                   "Whether the model runs in parts: split at a node whose outputs' sizes depend "
                   "on run-time values (NonZero, Unique, Compress, NonMaxSuppression), which runs "
                   "on the host between them.");
}

}  // namespace kiln::py
