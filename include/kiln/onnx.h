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
#include <memory>
#include <set>
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
  /// Element shapes of sequence-typed graph inputs by name, one shape per element (their
  /// number is the sequence's length). kiln holds a sequence while importing as the list of its
  /// elements: each element becomes an input named "name[k]" (-1 dims stay dynamic). A sequence
  /// input not given here raises InputValuesNeeded naming it (Session gives it from the feeds).
  std::map<std::string, std::vector<Shape>> sequence_inputs;
  /// Optional-typed graph inputs given without a value (an empty optional). Any other optional
  /// input holds its element: a tensor input of that name, or a sequence input as above.
  std::set<std::string> absent_inputs;
  /// Value given to every dim_param that input_shapes does not fix; -1 keeps it dynamic.
  int64_t default_dim = -1;
  /// Directory that external data files are read from; import(path) uses the model's directory.
  /// Empty: a model with external data is an IoError.
  std::string external_data_dir;
};

/// Raised by import when kiln needs, while importing, a value that comes from graph inputs not
/// given in ImportOptions::input_values (a Reshape's shape, a Slice's starts, a Loop's trip count
/// with scan outputs): `inputs` names those graph inputs. Session gives them from each run's
/// feeds. A node whose outputs' sizes depend on its inputs' values (NonZero, Unique, Compress,
/// NonMaxSuppression, RoiAlign's adaptive grids) also names itself (`node`: its first output) and
/// the inputs it reads (`values`), which may be computed by other nodes: Session then splits the
/// model there and runs that node on the host between the parts (docs/onnx.md).
class InputValuesNeeded : public UnsupportedError {
 public:
  InputValuesNeeded(const std::string& what, std::vector<std::string> names, std::string node = {},
                    std::vector<std::string> values = {}, std::vector<Shape> output_dims = {})
      : UnsupportedError(what),
        inputs(std::move(names)),
        node(std::move(node)),
        values(std::move(values)),
        output_dims(std::move(output_dims)) {}
  std::vector<std::string> inputs;
  std::string node;
  std::vector<std::string> values;
  /// The node's output shapes as far as they do not depend on the data (-1 for a dim that may),
  /// by output; empty where not known.
  std::vector<Shape> output_dims;
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
  /// For an element of a sequence-typed graph input or output ("name[k]"): the sequence's name.
  std::string sequence;
};

/// A graph output as the model declares it: a tensor (outputs[first]) or a sequence of tensors
/// (outputs[first] .. outputs[first + count - 1], named "name[0]" ...; an empty one has none).
struct GraphOutput {
  std::string name;
  bool sequence = false;
  /// An optional-typed output without a value (count 0).
  bool absent = false;
  DType dtype = f32;
  size_t first = 0;
  size_t count = 1;
};

struct Model {
  Graph graph;
  /// Graph inputs that are not initializers, in model order (without those fixed by
  /// ImportOptions::input_values).
  std::vector<ValueInfo> inputs;
  /// Names of the inputs whose values ImportOptions::input_values fixed.
  std::vector<std::string> fixed_inputs;
  /// Output tensors in model order, a sequence output's elements in its place.
  std::vector<ValueInfo> outputs;
  /// The graph's outputs as declared (tensors and sequences), in model order.
  std::vector<GraphOutput> graph_outputs;
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

struct SessionOptions {
  /// Shapes, values and the external data directory, as for import (values given here hold for
  /// every run; a shape given here fixes that input's dims).
  ImportOptions import;
  CompileOptions compile;
  /// Imports kept, one per distinct set of run-time input values; the least recently used goes
  /// first.
  size_t max_imports = 8;
  /// A node whose outputs' sizes depend on values computed at run time (NonZero, Unique,
  /// Compress, NonMaxSuppression, RoiAlign with adaptive grids) splits the model: the nodes
  /// before it run as one part, the node on the host, the rest as a second part compiled once
  /// for every size (docs/onnx.md). false: the model is imported again for each run's values of
  /// the graph inputs behind such a node.
  bool split_at_data_dependent_nodes = true;
};

/// A graph input or output value of a Session: a tensor, the elements of a sequence (ONNX's
/// sequence type), or none (an optional-typed value without one).
struct Value {
  Array tensor;
  std::vector<Array> sequence;
  bool is_sequence = false;
  bool is_none = false;
  /// A string tensor (ONNX's STRING type, which kiln's arrays lack): its elements in row-major
  /// order, UTF-8, and its shape. A session runs the nodes that read or make strings on the host
  /// (docs/onnx.md).
  bool is_string = false;
  std::vector<std::string> strings;
  Shape string_shape;
  static Value of(Array a) { return {std::move(a), {}, false, false}; }
  static Value of_sequence(std::vector<Array> items) { return {{}, std::move(items), true, false}; }
  static Value none() { return {{}, {}, false, true}; }
  static Value of_strings(std::vector<std::string> items, Shape shape) {
    Value v;
    v.is_string = true;
    v.strings = std::move(items);
    v.string_shape = std::move(shape);
    return v;
  }
};

/// An ONNX model that runs any feeds the model allows, as ONNX Runtime's sessions do. Inputs whose
/// values kiln needs while importing (shapes, axes, pads, repeats or trip counts that the model
/// takes as graph inputs: InputValuesNeeded names them) are read from each run's feeds, and the
/// model is imported and compiled once per distinct set of their values; a device feed of such an
/// input is copied to the host to be read. The other inputs keep their dynamic dims. Safe to run
/// from several threads.
class Session {
 public:
  /// Reads the model file (errors as import's); external data comes from its directory unless
  /// options.import names one.
  explicit Session(const std::string& path, Device device = default_device(),
                   SessionOptions options = {});
  /// A session over a serialized ModelProto.
  static Session from_bytes(const void* data, size_t size, Device device = default_device(),
                            SessionOptions options = {});
  /// Runs with feeds by input name (every input of the model); returns its outputs in order.
  /// Throws ValueError for a missing or unknown feed, and for a model with sequence inputs or
  /// outputs (run_values runs those).
  std::vector<Array> run(const std::map<std::string, Array>& feeds) const;
  /// Runs with feeds that may be sequences or none (an optional input without a value); returns
  /// the graph's outputs as declared (a sequence output as its elements, an optional one without
  /// a value as none). A sequence input's length and element shapes, and which optional inputs
  /// are none, select an import, as the values of value_inputs do.
  std::vector<Value> run_values(const std::map<std::string, Value>& feeds) const;
  /// The inputs whose run-time values select an import, in the order they were found.
  std::vector<std::string> value_inputs() const;
  /// Imports (each with its compile) made so far, and those kept.
  int64_t imports() const;
  size_t kept() const;
  /// The model as the last import made it (inputs, outputs, op histogram); the first import is
  /// made with the session, or at the first run when it needs input values (null until then).
  /// For a model split at a data-dependent node, the import of its first part (null when the
  /// node reads only graph inputs).
  std::shared_ptr<const Model> model() const;
  /// The graph's output names, in order (those of the last import, or of the model file for a
  /// model run in parts).
  std::vector<std::string> output_names() const;
  /// Whether the model runs in parts (split at a data-dependent node; then imports() and
  /// kept() count the parts' imports, the node's included: one per run's values).
  bool split() const;

 private:
  struct Impl;
  explicit Session(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

/// One line of kiln's ONNX op table: `op_type` from default-domain opset `since_version` on (an op
/// of another domain is named after it, "ai.onnx.ml.Binarizer", with that domain's opset).
struct OpSupport {
  std::string op_type;
  int since_version = 0;
};
/// Every (op type, since version) the importer maps.
std::vector<OpSupport> supported_ops();
/// True when the importer maps `op_type` at default-domain opset `opset` (or, for "domain.OpType",
/// at that domain's opset `opset`).
bool is_supported(const std::string& op_type, int64_t opset);

}  // namespace kiln::onnx
