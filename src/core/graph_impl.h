// Graph storage: nodes in topological order (inputs always precede their readers).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/op_id.h"
#include "kiln/array.h"
#include "kiln/attrs.h"
#include "kiln/graph.h"

namespace kiln {

struct OpParams;

struct TensorInfo {
  Shape shape;
  DType dtype = f32;
  bool operator==(const TensorInfo& o) const { return shape == o.shape && dtype == o.dtype; }
};

namespace detail {

struct ValueRef {
  int32_t node = -1;
  int32_t index = 0;
  bool operator==(const ValueRef& o) const { return node == o.node && index == o.index; }
  bool operator<(const ValueRef& o) const {
    return node < o.node || (node == o.node && index < o.index);
  }
};

struct Node {
  OpId op = OpId::Placeholder;
  std::vector<ValueRef> inputs;
  Attrs attrs;
  std::vector<TensorInfo> outputs;
  std::string name;
  Array value;          // data of a Constant
  int32_t origin = -1;  // id of the node in the user's graph this one came from (-1: made by a pass)
  /// The attributes decoded for the kernels (OpDef::decode), set when an executable is made from
  /// its program; null elsewhere and for ops that do not decode theirs.
  std::shared_ptr<const OpParams> params;
};

struct GraphImpl {
  std::vector<Node> nodes;

  /// Appends a node after inferring its outputs with the op's rule; returns its id.
  int32_t add(OpId op, std::vector<ValueRef> inputs, Attrs attrs, std::string name = "");
  /// Appends a node whose outputs are already known.
  int32_t add_inferred(Node node);
  const TensorInfo& info(ValueRef v) const { return nodes[v.node].outputs[v.index]; }
};

/// Builds a node on the graph of `inputs[0]` (all inputs must share one graph) and returns its
/// outputs as Tensors. Used by every op builder after it has canonicalized its inputs.
std::vector<Tensor> make_node(OpId op, const std::vector<Tensor>& inputs, Attrs attrs = {});
/// Single-output shorthand.
Tensor make_node1(OpId op, const std::vector<Tensor>& inputs, Attrs attrs = {});
/// A node without inputs on graph `g`.
std::vector<Tensor> make_source_node(GraphImpl& g, OpId op, Attrs attrs);

}  // namespace detail
}  // namespace kiln
