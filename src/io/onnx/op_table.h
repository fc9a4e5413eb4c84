// The ONNX op table: one entry per (op_type, since_version) mapping an ONNX node onto kiln ops
// (ops of other domains named after their domain: "ai.onnx.ml.Binarizer").
// An entry applies from its since_version up to the next entry of the same op type; a node is
// mapped by the newest entry whose since_version is <= the schema version of the node's op at
// the model's opset (schema_versions.inc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/array.h"
#include "kiln/graph.h"

namespace onnx {
class NodeProto;
class AttributeProto;
class GraphProto;
}  // namespace onnx

namespace kiln::onnx::detail {

class Importer;
struct Sequence;
struct Value;

/// What a mapping function sees of one node: its inputs as kiln tensors (and their values when
/// known while importing), its attributes, and the graph to add ops to.
class NodeContext {
 public:
  NodeContext(Importer& imp, const ::onnx::NodeProto& node, int schema_version)
      : imp_(imp), node_(node), version_(schema_version) {}

  Graph& graph();
  /// Schema version of this node's op (the since_version the model's opset selects).
  int version() const { return version_; }
  const std::string& op_type() const;

  /// Declared inputs, counting empty names (omitted optional inputs).
  int num_inputs() const;
  /// Input i is given (present and non-empty).
  bool has_input(int i) const;
  /// Input i; throws ValueError naming the node when it is missing.
  Tensor input(int i) const;
  /// Input i's value when it is known while importing (initializer, Constant, folded), else null.
  const Array* constant(int i) const;
  /// A known input as int64 values (any integer dtype); throws UnsupportedError naming the node
  /// when the value is only known at run time.
  std::vector<int64_t> ints(int i) const;
  /// A known input as doubles (any numeric dtype).
  std::vector<double> doubles(int i) const;
  /// Input i as the importer holds it: a tensor with its data where known, or a sequence.
  Value value(int i) const;
  /// Input i is an optional without a value (an absent optional graph input, Optional()).
  bool is_absent(int i) const;
  /// Makes output i an optional without a value.
  void set_absent(int i);
  /// Input i is a sequence (ONNX sequence type; src/io/onnx/ops_sequence.cpp).
  bool is_sequence(int i) const;
  /// Input i as a sequence; throws ValueError naming the node when it is missing or a tensor.
  const Sequence& sequence(int i) const;
  /// Makes output i a sequence (the mapping returns an invalid Tensor in its place).
  void set_sequence(int i, Sequence s);
  /// Declared outputs, counting empty names.
  int num_outputs() const;
  bool has_output(int i) const;

  bool has_attr(const std::string& name) const;
  int64_t attr_int(const std::string& name, int64_t fallback) const;
  float attr_float(const std::string& name, float fallback) const;
  std::string attr_string(const std::string& name, const std::string& fallback) const;
  std::vector<int64_t> attr_ints(const std::string& name,
                                 const std::vector<int64_t>& fallback = {}) const;
  std::vector<float> attr_floats(const std::string& name) const;
  /// A tensor attribute; throws ValueError when missing.
  Array attr_tensor(const std::string& name) const;
  /// A graph attribute (If branches); throws ValueError when missing.
  const ::onnx::GraphProto& attr_graph(const std::string& name) const;
  /// Throws ValueError when the attribute is missing.
  int64_t required_int(const std::string& name) const;

  /// "node 'conv_3' (Conv)": for error messages.
  std::string where() const;
  /// Throws ValueError "[onnx] node '...' (Op): message".
  [[noreturn]] void fail(const std::string& message) const;
  /// Throws UnsupportedError "[onnx] node '...' (Op): message".
  [[noreturn]] void unsupported(const std::string& message) const;
  /// Throws InputValuesNeeded (an UnsupportedError) for inputs `inputs` whose values are needed
  /// while importing but only known at run time: "[onnx] node '...' (Op): message", naming the
  /// graph inputs they come from (what onnx::Session reads from each run's feeds).
  [[noreturn]] void needs_values(const std::vector<int>& inputs, const std::string& message) const;
  /// As needs_values, for a node whose outputs' sizes depend on the values of `inputs` (which
  /// other nodes may compute): the error also names the node and those inputs, so that
  /// onnx::Session can run the node on the host between two parts of the model; `output_dims`:
  /// the outputs' shapes with -1 for each dim that depends on the data (or on unknown sizes).
  [[noreturn]] void needs_data(const std::vector<int>& inputs, const std::string& message,
                               std::vector<Shape> output_dims = {}) const;

  const ::onnx::NodeProto& proto() const { return node_; }
  Importer& importer() { return imp_; }

 private:
  const ::onnx::AttributeProto* attr(const std::string& name) const;
  [[noreturn]] void needs(const std::vector<int>& inputs, const std::string& message, bool data,
                          std::vector<Shape> output_dims = {}) const;
  Importer& imp_;
  const ::onnx::NodeProto& node_;
  int version_;
};

/// Maps a node; returns its outputs in order (fewer than declared when trailing optional outputs
/// are not produced; an invalid Tensor for an output the mapping does not produce).
using MapFn = std::vector<Tensor> (*)(NodeContext&);

struct OpEntry {
  const char* op_type;
  int since_version;
  MapFn map;
};

/// The families' tables; each is defined in ops_<family>.cpp.
void add_elementwise_ops(std::vector<OpEntry>& table);
void add_nn_ops(std::vector<OpEntry>& table);
void add_tensor_ops(std::vector<OpEntry>& table);
void add_reduce_ops(std::vector<OpEntry>& table);
void add_misc_ops(std::vector<OpEntry>& table);
void add_signal_ops(std::vector<OpEntry>& table);
void add_quant_ops(std::vector<OpEntry>& table);
void add_rnn_ops(std::vector<OpEntry>& table);
void add_random_ops(std::vector<OpEntry>& table);
void add_control_ops(std::vector<OpEntry>& table);
void add_transformer_ops(std::vector<OpEntry>& table);
void add_linear_attention_ops(std::vector<OpEntry>& table);
void add_sequence_ops(std::vector<OpEntry>& table);
void add_unique_ops(std::vector<OpEntry>& table);
void add_training_ops(std::vector<OpEntry>& table);  // ai.onnx.preview.training
void add_ml_ops(std::vector<OpEntry>& table);        // ai.onnx.ml
void add_text_ops(std::vector<OpEntry>& table);      // TfIdfVectorizer
void add_string_ops(std::vector<OpEntry>& table);    // strings.cpp: run on the host by Session

/// A node's key in the table: its op type, after its domain and a dot outside the default domain
/// ("ai.onnx.preview.training.Adam"; such an entry's since_version is its domain's opset).
std::string op_key(const ::onnx::NodeProto& node);

/// The whole table, sorted by (op_type, since_version).
const std::vector<OpEntry>& op_table();
/// Schema since_versions of a default-domain op (ascending), empty when ONNX has no such op.
const std::vector<int>& schema_versions(const std::string& op_type);
/// The entry that maps `op_type` (an op_key) at `opset` (its domain's), or null; `schema_version`
/// receives the version.
const OpEntry* find_entry(const std::string& op_type, int64_t opset, int* schema_version);

/// ONNX's data type numbers for the types newer than the onnx headers kiln builds with.
inline constexpr int32_t kOnnxFloat8E4M3FN = 17, kOnnxFloat8E4M3FNUZ = 18, kOnnxFloat8E5M2 = 19,
                         kOnnxFloat8E5M2FNUZ = 20, kOnnxUint4 = 21, kOnnxInt4 = 22,
                         kOnnxFloat4E2M1 = 23, kOnnxFloat8E8M0 = 24, kOnnxUint2 = 25,
                         kOnnxInt2 = 26;

/// ONNX TensorProto data type -> kiln dtype; nullopt for types kiln lacks.
std::optional<DType> from_onnx_dtype(int32_t onnx_type);
/// Name of an ONNX data type ("FLOAT", "UINT32", ...).
const char* onnx_dtype_name(int32_t onnx_type);
/// An element's width in an ONNX tensor: 4 for i4 u4 f4e2m1fn, 2 for i2 u2 (packed), else 8 a
/// byte of kiln's.
inline int onnx_bits(DType t) {
  if (t == DType::i4 || t == DType::u4 || t == DType::f4e2m1fn) return 4;
  if (t == DType::i2 || t == DType::u2) return 2;
  return 8 * static_cast<int>(size_of(t));
}

}  // namespace kiln::onnx::detail
