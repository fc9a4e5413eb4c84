// What the model commands (run, inspect, bench, convert) share: parsing NAME=VALUE options,
// importing with the shapes they fix, loading packages, random inputs, and printing shapes and
// placement.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kiln/coreml.h"
#include "kiln/executable.h"
#include "kiln/onnx.h"

namespace kiln::cli {

/// Splits "NAME=VALUE" at the last '=' (names may hold '='); throws ValueError naming `option`.
std::pair<std::string, std::string> split_assignment(const std::string& arg,
                                                     const std::string& option);
/// "1,3,224,224" (or "1x3x224x224") -> {1, 3, 224, 224}; "" or "scalar" -> {}.
Shape parse_dims(const std::string& dims, const std::string& option);
/// --shape NAME=dims, repeated.
std::map<std::string, Shape> parse_shapes(const std::vector<std::string>& args);
/// --input NAME=FILE.npy (or --value), repeated: loads every file.
std::map<std::string, Array> load_inputs(const std::vector<std::string>& args,
                                         const std::string& option = "--input");

/// Imports `path` (ONNX, or Core ML: is_coreml) with input shapes fixed by `shapes` and input
/// values by `values` (--value: axes or shapes an ONNX model takes as inputs); dim_params nothing
/// fixes get `default_dim` (-1 keeps them dynamic). Throws ValueError for a name the model lacks.
onnx::Model import_model(const std::string& path, const std::map<std::string, Shape>& shapes,
                         const std::map<std::string, Array>& values, int64_t default_dim);
/// The --value option's help.
inline constexpr const char* kValueHelp =
    "NAME=FILE.npy: fix an input's value while importing (axes, shapes or pads a model takes as "
    "inputs)";
/// Checks that every name in `names` is a model input.
void check_input_names(const onnx::Model& model, const std::vector<std::string>& names,
                       const std::string& option);
/// Same, against a list of input names.
void check_input_names(const std::vector<std::string>& inputs,
                       const std::vector<std::string>& names, const std::string& option);
/// Concrete shapes for compiling: the given ones, else the imported shape with dynamic dims 1.
std::map<std::string, Shape> concrete_shapes(const onnx::Model& model,
                                             const std::map<std::string, Shape>& given);

/// "(batch=1, 3, 224, 224)": dims with their dim_param names.
std::string describe_shape(const Shape& shape, const std::vector<std::string>& dim_params);
/// The dim names of an executable's input, one per dim ("" for a dim without one).
std::vector<std::string> dim_names(const Executable::IoInfo& in);
/// A file name safe to write inside a directory: only [A-Za-z0-9._-], no leading '.', never "".
std::string safe_file_name(const std::string& name);
/// FNV-1a (64-bit) of a file's bytes as "fnv1a64:<hex>": a package records its model file's so.
std::string file_hash(const std::string& path);
/// Random values: floats uniform in [-1, 1), integers in [0, 4), bools fair coins.
Array random_array(const Shape& shape, DType dtype, std::mt19937_64& rng);
/// Device from --device ("" -> kiln::default_device()).
Device pick_device(const std::string& device);

/// True when `path` is a Core ML model: an `.mlpackage` directory (or any directory holding a
/// Manifest.json) or an `.mlmodel` file.
bool is_coreml(const std::string& path);
/// True when `path` is a kiln package: it starts with the package magic ("KILNPKG\0", or at least
/// its first 4 bytes when the file is shorter), or its name ends in ".kiln" (the package reader
/// then says what is wrong). Anything else is read as ONNX. Throws IoError naming the file when it
/// cannot be read.
bool is_package(const std::string& path, const std::string& command);

/// --strict and --no-verify-weights, the options of loading a package.
struct PackageFlags {
  bool strict = false;
  bool no_verify_weights = false;
};
void add_package_flags(CLI::App* cmd, PackageFlags& flags);

/// What a model command was given besides the model file.
struct ModelArgs {
  std::string command;                  // "run", for messages
  std::map<std::string, Shape> shapes;  // --shape (and the shapes of --input arrays)
  std::map<std::string, Array> values;  // --value
  std::map<std::string, Array> inputs;  // --input
  int64_t default_dim = 1;              // dims nothing fixes (ONNX only)
  PackageFlags package;
};

/// A model ready to run on one device: an ONNX model imported and compiled, or a package loaded.
struct PreparedModel {
  Executable exe;
  /// Inputs and outputs with the shapes it was compiled for, in model order.
  std::vector<Executable::IoInfo> inputs, outputs;
  std::optional<onnx::Model> onnx;  // set for an ONNX model (and a Core ML one, converted)
  bool coreml = false;              // onnx holds a Core ML model
  double prepare_ms = 0;            // import + compile, or load

  bool is_package() const { return !onnx; }
  /// "import + compile" or "load".
  const char* prepare_what() const { return onnx ? "import + compile" : "load"; }
  /// Runs with inputs by name (already on the executable's device, or on the host).
  std::vector<Array> run(const std::map<std::string, Array>& inputs) const;
  /// The same, with the inputs matched to the model once (for timing many runs); the function
  /// refers to this PreparedModel, which must outlive it.
  std::function<std::vector<Array>()> bind(const std::map<std::string, Array>& inputs) const;
};

/// Imports and compiles an ONNX model, or loads a package, for `device`. For a package, the
/// options only an ONNX model takes (--value; --shape unless it equals a compiled shape) and
/// --input arrays of other shapes or dtypes are ValueErrors naming the file; for an ONNX model,
/// --strict and --no-verify-weights are. Checks that every --input names an input.
PreparedModel prepare_model(const std::string& path, const ModelArgs& args, Device device);

/// The given --input arrays, and random ones (seeded by `seed`) for the inputs not given.
std::map<std::string, Array> complete_inputs(const PreparedModel& model,
                                             const std::map<std::string, Array>& given,
                                             uint64_t seed);
/// "  input X  f32  (5, 4) (given)" for every input.
void print_inputs(const PreparedModel& model, const std::map<std::string, Array>& given);

/// Input and output lines, opset, producer, parameters, op histogram.
void print_model_summary(const onnx::Model& model);
/// Kernels per backend and every CPU fallback with its reason.
void print_placement(const Executable& exe);
/// A package's outputs, "output<i>" for those without a name.
std::vector<Executable::IoInfo> package_outputs(const Executable& exe);
/// A package's metadata, inputs, outputs, variables, kernels per op and sizes (see inspect).
void print_package_summary(const Executable& exe);

}  // namespace kiln::cli
