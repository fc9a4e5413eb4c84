// The ONNX importer's state while it walks one model: the value of every ONNX name as a kiln
// tensor, plus its data when known while importing (initializers, Constant nodes, folded
// shape arithmetic).
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kiln/onnx.h"

namespace onnx {
class ModelProto;
class TensorProto;
class GraphProto;
class NodeProto;
class ValueInfoProto;
class TypeProto;
}  // namespace onnx

namespace kiln::onnx::detail {

/// An ONNX sequence value (SequenceConstruct, SequenceInsert, a sequence-typed graph input):
/// kiln holds it while importing as the list of its elements, so its length and every position
/// read or written must be known then.
struct Sequence {
  DType dtype = f32;
  std::vector<Tensor> items;
};

/// A value: a tensor (with its data when known while importing), a sequence, or an optional
/// without a value (`absent`).
struct Value {
  Tensor tensor;
  std::optional<Array> data;
  std::optional<Sequence> sequence;
  bool absent = false;
  bool defined() const { return tensor.valid() || sequence || absent; }
};

class Importer {
 public:
  Importer(const ::onnx::ModelProto& model, const ImportOptions& options);
  Model run();

  Graph& graph() { return model_.graph; }
  const Value* find(const std::string& name) const;
  /// A tensor as a value, with its data when known while importing.
  Value value_of(const Tensor& t) const;
  /// A constant tensor for `value`, remembered as known data.
  Tensor constant(const Array& value);
  /// Reads a TensorProto (external data from the options' directory) into a host Array.
  Array tensor(const ::onnx::TensorProto& t) const;
  /// The opset the model imports for the node's domain (0 when it imports none).
  int64_t opset_of(const ::onnx::NodeProto& node) const;
  /// Maps a subgraph's nodes into this graph (names from enclosing scopes resolve); returns its
  /// outputs (a sequence output is a ValueError naming it: see inline_values).
  std::vector<Tensor> inline_graph(const ::onnx::GraphProto& g);
  /// The same for a body whose graph inputs are `inputs` (a Loop body's iteration number,
  /// condition and carried values), bound by the subgraph's input names.
  std::vector<Tensor> inline_body(const ::onnx::GraphProto& g, const std::vector<Tensor>& inputs);
  /// inline_body with inputs and outputs that may be sequences (their data kept where known).
  std::vector<Value> inline_values(const ::onnx::GraphProto& g, const std::vector<Value>& inputs);
  /// Whether any node of `g` (or of its subgraphs) reads a sequence of the scopes around it.
  bool reads_outer_sequence(const ::onnx::GraphProto& g) const;
  /// Counts one more body mapped while importing for an unrolled Loop or a SequenceMap; false
  /// past the import's budget (65,536 in all, so a model cannot make an import endless).
  bool count_unrolled() { return ++unrolled_ <= (int64_t{1} << 16); }
  /// Records a sequence as a node's output `name` (set by the sequence ops' mappings).
  void set_sequence(const std::string& name, Sequence s) { pending_[name] = std::move(s); }
  /// Records a node's output `name` as an optional without a value.
  void set_absent(const std::string& name) { absent_.insert(name); }
  /// The main graph's inputs (not initializers) that value `name` is computed from, following
  /// the nodes that produce it (those of bodies too), in model order.
  std::vector<std::string> graph_inputs_behind(const std::string& name);

 private:
  void check_supported(const ::onnx::GraphProto& g);
  void add_inputs(const ::onnx::GraphProto& g);
  void add_sequence_input(const ::onnx::ValueInfoProto& in, const ::onnx::TypeProto& type);
  void add_sequence_output(const std::string& name, const Sequence& seq);
  void add_node(const ::onnx::NodeProto& node);
  void fold(const std::vector<std::string>& names);

  const ::onnx::ModelProto& proto_;
  const ImportOptions& options_;
  Model model_;
  std::map<std::string, Value> values_;
  // data of the constants this import created, by (graph, node, output): a branch or loop body
  // builds its own graph, whose node ids repeat the outer graph's
  std::map<std::tuple<const void*, int32_t, int32_t>, Array> known_;
  // the node producing each value name, over the main graph and every subgraph (made on first use)
  std::map<std::string, const ::onnx::NodeProto*> producer_;
  // sequences the node being mapped gives, by output name
  std::map<std::string, Sequence> pending_;
  std::set<std::string> absent_;  // (outputs of the node being mapped)
  int64_t unrolled_ = 0;
};

/// Converts a TensorProto to an Array; `external_dir` confines external data (empty: refused).
Array read_tensor(const ::onnx::TensorProto& t, const std::string& external_dir);

}  // namespace kiln::onnx::detail
