// The ONNX importer's state while it walks one model: the value of every ONNX name as a kiln
// tensor, plus its data when known while importing (initializers, Constant nodes, folded
// shape arithmetic).
#pragma once

#include <map>
#include <optional>
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
}  // namespace onnx

namespace kiln::onnx::detail {

struct Value {
  Tensor tensor;
  std::optional<Array> data;
};

class Importer {
 public:
  Importer(const ::onnx::ModelProto& model, const ImportOptions& options);
  Model run();

  Graph& graph() { return model_.graph; }
  const Value* find(const std::string& name) const;
  /// A constant tensor for `value`, remembered as known data.
  Tensor constant(const Array& value);
  /// Reads a TensorProto (external data from the options' directory) into a host Array.
  Array tensor(const ::onnx::TensorProto& t) const;
  /// Maps a subgraph's nodes into this graph (names from enclosing scopes resolve); returns its
  /// outputs.
  std::vector<Tensor> inline_graph(const ::onnx::GraphProto& g);
  /// The same for a body whose graph inputs are `inputs` (a Loop body's iteration number,
  /// condition and carried values), bound by the subgraph's input names.
  std::vector<Tensor> inline_body(const ::onnx::GraphProto& g, const std::vector<Tensor>& inputs);
  /// The main graph's inputs (not initializers) that value `name` is computed from, following
  /// the nodes that produce it (those of bodies too), in model order.
  std::vector<std::string> graph_inputs_behind(const std::string& name);

 private:
  void check_supported(const ::onnx::GraphProto& g);
  void add_inputs(const ::onnx::GraphProto& g);
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
};

/// Converts a TensorProto to an Array; `external_dir` confines external data (empty: refused).
Array read_tensor(const ::onnx::TensorProto& t, const std::string& external_dir);

}  // namespace kiln::onnx::detail
