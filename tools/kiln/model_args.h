// What the model commands (run, inspect, bench, convert) share: parsing NAME=VALUE options,
// importing with the shapes they fix, random inputs, and printing shapes and placement.
#pragma once

#include <map>
#include <random>
#include <string>
#include <vector>

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

/// Imports `path` with input shapes fixed by `shapes` and input values by `values` (--value:
/// axes or shapes a model takes as inputs); dim_params nothing fixes get `default_dim` (-1 keeps
/// them dynamic). Throws ValueError for a name the model lacks.
onnx::Model import_model(const std::string& path, const std::map<std::string, Shape>& shapes,
                         const std::map<std::string, Array>& values, int64_t default_dim);
/// The --value option's help.
inline constexpr const char* kValueHelp =
    "NAME=FILE.npy: fix an input's value while importing (axes, shapes or pads a model takes as "
    "inputs)";
/// Checks that every name in `names` is a model input.
void check_input_names(const onnx::Model& model, const std::vector<std::string>& names,
                       const std::string& option);
/// Concrete shapes for compiling: the given ones, else the imported shape with dynamic dims 1.
std::map<std::string, Shape> concrete_shapes(const onnx::Model& model,
                                             const std::map<std::string, Shape>& given);

/// "(batch=1, 3, 224, 224)": dims with their dim_param names.
std::string describe_shape(const Shape& shape, const std::vector<std::string>& dim_params);
/// A file name safe to write inside a directory: only [A-Za-z0-9._-], no leading '.', never "".
std::string safe_file_name(const std::string& name);
/// Random values: floats uniform in [-1, 1), integers in [0, 4), bools fair coins.
Array random_array(const Shape& shape, DType dtype, std::mt19937_64& rng);
/// Device from --device ("" -> kiln::default_device()).
Device pick_device(const std::string& device);

/// Input and output lines, opset, producer, parameters, op histogram.
void print_model_summary(const onnx::Model& model);
/// Kernels per backend and every CPU fallback with its reason.
void print_placement(const Executable& exe);

}  // namespace kiln::cli
