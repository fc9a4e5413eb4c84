// Core ML import (kiln.coreml).
#include <kiln/coreml.h>

#include "common.h"

namespace kiln::py {

namespace {

using Shapes = std::map<std::string, std::vector<int64_t>>;

coreml::ImportOptions import_options(const Shapes& shapes, const std::string& function,
                                     const std::string& weights_dir) {
  coreml::ImportOptions o;
  for (const auto& [k, v] : shapes) o.input_shapes[k] = v;
  o.function = function;
  o.weights_dir = weights_dir;
  return o;
}

}  // namespace

void bind_coreml(nb::module_& m) {
  nb::module_ c = m.def_submodule("coreml", "Core ML import.");
  nb::class_<coreml::ValueInfo>(c, "ValueInfo", nb::dynamic_attr(),
                                "An input or output of an imported Core ML model.")
      .def_ro("name", &coreml::ValueInfo::name)
      .def_ro("tensor", &coreml::ValueInfo::tensor)
      .def_ro("dtype", &coreml::ValueInfo::dtype)
      .def_ro("shape", &coreml::ValueInfo::shape)
      .def_ro("image", &coreml::ValueInfo::image,
              "For an image input: 'RGB', 'BGR' or 'GRAYSCALE'; else ''.")
      .def_ro("description", &coreml::ValueInfo::description)
      .def("__repr__", [](const coreml::ValueInfo& v) {
        return "ValueInfo('" + v.name + "', " + to_string(v.shape) + ", " + name(v.dtype) + ")";
      });
  nb::class_<coreml::Model>(c, "Model",
                            "An imported Core ML model: a kiln Graph with named inputs and "
                            "outputs.")
      .def_prop_ro(
          "graph", [](coreml::Model& md) -> Graph& { return md.graph; },
          nb::rv_policy::reference_internal)
      .def_prop_ro(
          "inputs",
          [](nb::handle self) { return value_infos(self, nb::cast<coreml::Model&>(self).inputs); })
      .def_prop_ro(
          "outputs",
          [](nb::handle self) { return value_infos(self, nb::cast<coreml::Model&>(self).outputs); })
      .def_ro("spec_version", &coreml::Model::spec_version)
      .def_ro("kind", &coreml::Model::kind)
      .def_ro("function", &coreml::Model::function)
      .def_ro("opset", &coreml::Model::opset)
      .def_ro("metadata", &coreml::Model::metadata)
      .def_ro("parameter_count", &coreml::Model::parameter_count)
      .def_ro("parameter_bytes", &coreml::Model::parameter_bytes)
      .def_ro("op_histogram", &coreml::Model::op_histogram)
      .def("output_tensors",
           [](nb::handle self) {
             return tensor_list(nb::cast<coreml::Model&>(self).output_tensors(), self);
           })
      .def(
          "compile",
          [](coreml::Model& md, std::optional<Device> device, const Shapes& shapes,
             std::optional<CompileOptions> options) {
            const Device d = device ? *device : default_device();
            nb::gil_scoped_release release;
            return md.graph.compile(d, md.feed_shapes(shapes), md.output_tensors(),
                                    options.value_or(CompileOptions{}));
          },
          nb::arg("device") = nb::none(), nb::arg("shapes") = Shapes{},
          nb::arg("options") = nb::none(), nb::keep_alive<0, 1>(),
          "Compiles the model's outputs; run the executable with feeds by input name.");
  c.def(
      "load",
      [](const std::string& path, const Shapes& shapes, const std::string& function,
         const std::string& weights_dir) {
        auto opts = import_options(shapes, function, weights_dir);
        nb::gil_scoped_release release;
        return coreml::import(path, opts);
      },
      nb::arg("path"), nb::arg("input_shapes") = Shapes{}, nb::arg("function") = "",
      nb::arg("weights_dir") = "",
      "Imports an .mlpackage directory or an .mlmodel file (kiln::coreml::import). Raises "
      "UnsupportedError listing every unsupported op. input_shapes fixes flexible dims; "
      "function picks an ML Program function other than the default.");
  c.def(
      "load_bytes",
      [](nb::bytes data, const Shapes& shapes, const std::string& function,
         const std::string& weights_dir) {
        auto opts = import_options(shapes, function, weights_dir);
        return coreml::import_bytes(data.c_str(), data.size(), opts);
      },
      nb::arg("data"), nb::arg("input_shapes") = Shapes{}, nb::arg("function") = "",
      nb::arg("weights_dir") = "",
      "Imports a serialized Core ML Model message (an .mlmodel file's bytes); weight files are "
      "read from weights_dir.");
  c.def("supported_ops", &coreml::supported_ops, "Every MIL op type the importer maps.");
  c.def("supported_layers", &coreml::supported_layers,
        "Every NeuralNetwork layer type the importer maps ('convolution', 'innerProduct', ...).");
  c.def("available", &coreml::available,
        "Whether this build imports Core ML models (built with KILN_COREML).");
}

}  // namespace kiln::py
