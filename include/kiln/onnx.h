// ONNX import: an ONNX model file becomes a kiln Graph with named inputs and outputs.
//
// Default-domain opsets 7-21 are supported (a newer opset imports when none of the model's ops
// changed after 21). Initializers become constants; shape subgraphs (Shape -> Gather -> Concat ->
// Reshape ...) fold to constants while importing, so every input shape must be known then: a
// dim_param either gets a value from ImportOptions::input_shapes or stays dynamic (-1), and an
// op that needs a dynamic dim's value to build raises ShapeError naming the input to fix.
// Unsupported models raise one UnsupportedError listing every unsupported op type with its nodes
// and opset. External data (tensors in side files) is read only from inside the model's own
// directory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/array.h"
#include "kiln/graph.h"

namespace kiln::onnx {

struct ImportOptions {
  /// Concrete shapes of graph inputs by name. They fix dim_params (and must agree with the
  /// model's fixed dims).
  std::map<std::string, Shape> input_shapes;
  /// Values of graph inputs that kiln needs while importing (axes, shapes, pads or repeats that
  /// a model takes as inputs): they become constants and are no longer inputs of the Model.
  std::map<std::string, Array> input_values;
  /// Value given to every dim_param that input_shapes does not fix; -1 keeps it dynamic.
  int64_t default_dim = -1;
  /// Directory that external data files are read from; import(path) uses the model's directory.
  /// Empty: a model with external data is an IoError.
  std::string external_data_dir;
};

/// A graph input or output of the imported model.
struct ValueInfo {
  std::string name;
  Tensor tensor;
  DType dtype = f32;
  /// Shape as imported (-1 for a dim still dynamic).
  Shape shape;
  /// The model's symbolic names per dim ("" where the dim is fixed or unnamed).
  std::vector<std::string> dim_params;
};

struct Model {
  Graph graph;
  /// Graph inputs that are not initializers, in model order (without those fixed by
  /// ImportOptions::input_values).
  std::vector<ValueInfo> inputs;
  /// Names of the inputs whose values ImportOptions::input_values fixed.
  std::vector<std::string> fixed_inputs;
  std::vector<ValueInfo> outputs;
  int64_t ir_version = 0;
  /// Default-domain opset.
  int64_t opset = 0;
  std::string producer;  // "pytorch 2.5.0"
  /// Elements and bytes held by initializers and Constant nodes.
  int64_t parameter_count = 0;
  int64_t parameter_bytes = 0;
  /// Node count per ONNX op type.
  std::map<std::string, int64_t> op_histogram;

  /// Output tensors in model order (compile targets).
  std::vector<Tensor> output_tensors() const;
  /// Pairs each array with the input of that name (arrays for fixed inputs are skipped). Throws
  /// ValueError for an unknown or missing name, ShapeError/DTypeError when an array does not fit.
  Feeds feeds(const std::map<std::string, Array>& by_name) const;
  /// Shapes of the inputs, for Graph::compile (dynamic dims must be fixed by `by_name`).
  FeedShapes feed_shapes(const std::map<std::string, Shape>& by_name = {}) const;
};

/// Imports a model file. Throws IoError (unreadable file, unsafe external data), FormatError
/// (not an ONNX model, inconsistent tensors), UnsupportedError (ops, opsets or dtypes kiln does
/// not have) or ShapeError.
Model import(const std::string& path, const ImportOptions& options = {});
/// Imports a serialized ModelProto.
Model import_bytes(const void* data, size_t size, const ImportOptions& options = {});

/// One line of kiln's ONNX op table: `op_type` from default-domain opset `since_version` on.
struct OpSupport {
  std::string op_type;
  int since_version = 0;
};
/// Every (op type, since version) the importer maps.
std::vector<OpSupport> supported_ops();
/// True when the importer maps `op_type` at default-domain opset `opset`.
bool is_supported(const std::string& op_type, int64_t opset);

}  // namespace kiln::onnx
