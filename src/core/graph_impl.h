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

struct Body;

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
  /// The subgraphs a control-flow node runs (cond's branches; a loop's condition and body). Passes
  /// copy them with the node and leave them alone; the executable compiles each on its own.
  std::vector<std::shared_ptr<const Body>> bodies;
};

struct GraphImpl {
  std::vector<Node> nodes;

  /// Appends a node after inferring its outputs with the op's rule; returns its id.
  int32_t add(OpId op, std::vector<ValueRef> inputs, Attrs attrs, std::string name = "",
              std::vector<std::shared_ptr<const Body>> bodies = {});
  /// Appends a node whose outputs are already known.
  int32_t add_inferred(Node node);
  const TensorInfo& info(ValueRef v) const { return nodes[v.node].outputs[v.index]; }
};

/// Builds a node on the graph of `inputs[0]` (all inputs must share one graph, but while a body
/// is built (BodyCapture), values of the graphs around it are captured into it) and returns its
/// outputs as Tensors. Used by every op builder after it has canonicalized its inputs.
std::vector<Tensor> make_node(OpId op, const std::vector<Tensor>& inputs, Attrs attrs = {},
                              std::vector<std::shared_ptr<const Body>> bodies = {});
/// Single-output shorthand.
Tensor make_node1(OpId op, const std::vector<Tensor>& inputs, Attrs attrs = {});
/// A node without inputs on graph `g`.
std::vector<Tensor> make_source_node(GraphImpl& g, OpId op, Attrs attrs);

/// While a control-flow op's body is built on `body`, an op that mixes values of `body` and of
/// `outer` (or of a graph around `outer`, when bodies nest) reads the outer values through
/// placeholders of `body`, made once per value: the captured values, which become operands of the
/// control node. Scopes nest on one thread (a body built inside a body).
class BodyCapture {
 public:
  BodyCapture(GraphImpl& body, GraphImpl& outer);
  ~BodyCapture();
  BodyCapture(const BodyCapture&) = delete;
  BodyCapture& operator=(const BodyCapture&) = delete;
  /// `t` as a value of the body: itself when it is one, else the placeholder that captures it.
  /// Throws ValueError for a value of an unrelated graph.
  Tensor capture(const Tensor& t, const char* op);
  /// The captured values of `outer`, in order, and their placeholders in the body.
  const std::vector<std::pair<ValueRef, int32_t>>& captured() const { return captured_; }
  GraphImpl& body() const { return body_; }
  /// The innermost scope on this thread (nullptr: no body is being built).
  static BodyCapture* current();

 private:
  GraphImpl& body_;
  GraphImpl& outer_;
  BodyCapture* parent_;
  std::vector<std::pair<ValueRef, int32_t>> captured_;
};

}  // namespace detail

/// A subgraph of a control-flow node: its own nodes, where placeholder `operands[i]` takes the
/// node's operand i (-1: the body does not read it) and `results` are the values it gives.
struct Body {
  detail::GraphImpl graph;
  std::vector<int32_t> operands;
  std::vector<detail::ValueRef> results;
};

/// The infos of a body's results when its operands have `operands`' infos (every node inferred
/// again; a placeholder keeps its dtype and rank). Throws like the inference of its nodes.
std::vector<TensorInfo> infer_body(const Body& b, const std::vector<TensorInfo>& operands);

}  // namespace kiln
