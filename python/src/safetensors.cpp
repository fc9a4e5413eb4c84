// kiln._kiln.safetensors: Hugging Face safetensors files and checkpoint directories
// (include/kiln/safetensors.h), read into numpy arrays.
#include "kiln/safetensors.h"

#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "common.h"

namespace kiln::py {

void bind_safetensors(nb::module_& m) {
  nb::module_ s = m.def_submodule("safetensors", "Hugging Face safetensors files.");
  s.def(
      "load",
      [](const std::string& path) {
        std::map<std::string, Array> arrays;
        {
          nb::gil_scoped_release nogil;
          arrays = safetensors::File::open(path).read_all();
        }
        nb::dict d;
        for (const auto& [name, a] : arrays) d[nb::str(name.c_str())] = to_numpy(a);
        return d;
      },
      nb::arg("path"),
      "Every tensor of a .safetensors file as a numpy array, by name (the header checked "
      "first: kiln::safetensors::File).");
  s.def(
      "metadata", [](const std::string& path) { return safetensors::File::open(path).metadata(); },
      nb::arg("path"), "The header's __metadata__ (str -> str).");
  s.def(
      "checkpoint_names",
      [](const std::string& dir) { return safetensors::Checkpoint::open(dir).names(); },
      nb::arg("dir"),
      "The tensor names of a checkpoint directory (model.safetensors or the shards its "
      "index names), sorted.");
}

}  // namespace kiln::py
