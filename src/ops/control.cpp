// Ops of the control family (include/kiln/ops/control.h): cond, while_loop, for_loop. Their
// bodies are Node::bodies (core/graph_impl.h); the runtime compiles each body for the
// executable's device and runs it from the host (src/runtime/control.cpp).
//   cond:       inputs (pred, operands...); bodies (then, else), each over the operands
//   while_loop: inputs (carried..., captured...); attrs num_carried, max_trip_count (-1: none);
//               bodies (cond over all inputs -> one bool, body over all inputs -> carried)
//   for_loop:   inputs (n, carried..., captured...); attr num_carried; bodies (body over
//               (i, carried..., captured...) -> carried), i a 0-d int64
// A captured operand is a value of the graph around the node that a body reads.
#include "kiln/ops/control.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "core/op_registry.h"
#include "core/sym_dim.h"
#include "ops/common.h"

namespace kiln {

using detail::GraphImpl;
using detail::Node;
using detail::ValueRef;

namespace {

std::string info_str(const TensorInfo& t) {
  return fmt::format("{} {}", name(t.dtype), str(t.shape));
}

const Body& body_of(const InferContext& ctx, size_t k) {
  if (!ctx.bodies || ctx.bodies->size() <= k || !(*ctx.bodies)[k])
    fail<ValueError>("[{}] the node has {} bodies, not the {} it needs", ctx.name(),
                     ctx.bodies ? ctx.bodies->size() : 0, k + 1);
  return *(*ctx.bodies)[k];
}

// A 0-d (or one-element) value of `want`'s kind: the predicate or the trip count.
void check_scalar(const InferContext& ctx, const TensorInfo& t, bool want_bool, const char* what) {
  const bool kind_ok = want_bool ? t.dtype == boolean : is_integer(t.dtype);
  bool one = true;
  for (int64_t d : t.shape) one = one && d == 1;
  if (!kind_ok || !one)
    fail<DTypeError>("[{}] {} must be a {} with one element, got {}", ctx.name(), what,
                     want_bool ? "bool" : "integer", info_str(t));
}

// Whether two dims may be one size: equal, or not both known (symbolic and unknown dims are
// checked again when shapes are specialized, with sizes).
bool may_agree(int64_t a, int64_t b) { return a == b || !sym::is_size(a) || !sym::is_size(b); }

// Results of a loop's body against the carried values they replace.
void check_carried(const InferContext& ctx, const std::vector<TensorInfo>& results,
                   const std::vector<TensorInfo>& carried) {
  if (results.size() != carried.size())
    fail<ShapeError>("[{}] the body gives {} values for {} carried values", ctx.name(),
                     results.size(), carried.size());
  for (size_t k = 0; k < carried.size(); ++k) {
    const Shape& r = results[k].shape;
    bool same = results[k].dtype == carried[k].dtype && r.size() == carried[k].shape.size();
    for (size_t d = 0; same && d < r.size(); ++d) same = may_agree(r[d], carried[k].shape[d]);
    if (same) continue;
    const std::string what = fmt::format(
        "[{}] body result {} is {} but carried value {} is {} (a carried value "
        "keeps its dtype and shape)",
        ctx.name(), k, info_str(results[k]), k, info_str(carried[k]));
    if (results[k].dtype != carried[k].dtype) fail<DTypeError>("{}", what);
    fail<ShapeError>("{}", what);
  }
}

int64_t num_carried(const InferContext& ctx, size_t first) {
  const int64_t n = ctx.attrs.i("num_carried", -1);
  if (n < 1 || first + static_cast<size_t>(n) > ctx.inputs.size())
    fail<ValueError>("[{}] num_carried {} does not fit {} inputs", ctx.name(), n,
                     ctx.inputs.size());
  return n;
}

std::vector<TensorInfo> infer_cond(const InferContext& ctx) {
  if (ctx.inputs.empty()) fail<ValueError>("[cond] takes a predicate");
  check_scalar(ctx, ctx.inputs[0], true, "the predicate");
  const std::vector<TensorInfo> operands(ctx.inputs.begin() + 1, ctx.inputs.end());
  std::vector<TensorInfo> a = infer_body(body_of(ctx, 0), operands);
  const std::vector<TensorInfo> b = infer_body(body_of(ctx, 1), operands);
  if (a.size() != b.size())
    fail<ShapeError>("[cond] then_fn gives {} results but else_fn gives {}", a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    bool same = a[k].dtype == b[k].dtype && a[k].shape.size() == b[k].shape.size();
    for (size_t d = 0; same && d < a[k].shape.size(); ++d) {
      int64_t& x = a[k].shape[d];
      const int64_t y = b[k].shape[d];
      same = may_agree(x, y);
      // a size where one branch knows it, else then_fn's expression (both must agree when
      // shapes are specialized)
      if (same && !sym::is_size(x) && (sym::is_size(y) || !sym::is_symbolic(x))) x = y;
    }
    if (a[k].dtype != b[k].dtype)
      fail<DTypeError>("[cond] result {} is {} in then_fn but {} in else_fn", k, info_str(a[k]),
                       info_str(b[k]));
    if (!same)
      fail<ShapeError>("[cond] result {} is {} in then_fn but {} in else_fn", k, info_str(a[k]),
                       info_str(b[k]));
  }
  return a;
}

std::vector<TensorInfo> infer_while_loop(const InferContext& ctx) {
  const int64_t nc = num_carried(ctx, 0);
  const std::vector<TensorInfo> c = infer_body(body_of(ctx, 0), ctx.inputs);
  if (c.size() != 1)
    fail<ShapeError>("[while_loop] cond_fn must give one bool, gives {} values", c.size());
  check_scalar(ctx, c[0], true, "cond_fn's result");
  std::vector<TensorInfo> carried(ctx.inputs.begin(), ctx.inputs.begin() + nc);
  check_carried(ctx, infer_body(body_of(ctx, 1), ctx.inputs), carried);
  return carried;
}

std::vector<TensorInfo> infer_for_loop(const InferContext& ctx) {
  const int64_t nc = num_carried(ctx, 1);
  check_scalar(ctx, ctx.inputs[0], false, "the trip count");
  std::vector<TensorInfo> operands = ctx.inputs;
  operands[0] = {{}, i64};
  std::vector<TensorInfo> carried(ctx.inputs.begin() + 1, ctx.inputs.begin() + 1 + nc);
  check_carried(ctx, infer_body(body_of(ctx, 0), operands), carried);
  return carried;
}

// ---- building bodies

// A body built from `fn` on a graph of its own, over placeholders of `infos`, and the values of
// the graph around it that it captured.
struct BuiltBody {
  std::shared_ptr<Body> body;
  std::vector<std::pair<ValueRef, int32_t>> captured;
};

BuiltBody build_body(const char* op, const char* which, GraphImpl& outer,
                     const std::vector<TensorInfo>& infos, const BodyFn& fn) {
  if (!fn) fail<ValueError>("[{}] {} is empty", op, which);
  BuiltBody out{std::make_shared<Body>(), {}};
  Body& body = *out.body;
  std::vector<Tensor> args;
  for (size_t k = 0; k < infos.size(); ++k) {
    Node n;
    n.op = OpId::Placeholder;
    n.outputs = {infos[k]};
    n.name = fmt::format("{}.operand{}", which, k);
    n.attrs.set("shape", infos[k].shape).set("dtype", infos[k].dtype);
    const int32_t id = body.graph.add_inferred(std::move(n));
    body.operands.push_back(id);
    args.emplace_back(&body.graph, id, 0);
  }
  detail::BodyCapture scope(body.graph, outer);
  const std::vector<Tensor> results = fn(args);
  for (size_t k = 0; k < results.size(); ++k) {
    if (!results[k].valid()) fail<ValueError>("[{}] {} result {} is an empty Tensor", op, which, k);
    const Tensor v = scope.capture(results[k], op);
    body.results.push_back({v.node_id(), v.output_index()});
  }
  for (const Node& n : body.graph.nodes)
    if (op_def(n.op).writes_variable)
      fail<ValueError>("[{}] {} has an {} node; a body may not assign variables", op, which,
                       op_name(n.op));
  out.captured = scope.captured();
  return out;
}

// The graph the node goes on: the body being built around this call, or the inputs' own graph.
GraphImpl& node_graph(const char* op, std::vector<Tensor>& inputs) {
  if (inputs.empty() || !inputs[0].valid()) fail<ValueError>("[{}] input 0 is an empty Tensor", op);
  detail::BodyCapture* scope = detail::BodyCapture::current();
  if (!scope) return *inputs[0].graph_impl();
  for (Tensor& t : inputs) t = scope->capture(t, op);
  return scope->body();
}

// The node over `inputs` plus every value a body captured (once each, in order); each body's
// operand list grows by its placeholder for each (-1 where another body captured it).
std::vector<Tensor> make_control_node(OpId op, std::vector<Tensor> inputs, GraphImpl& g,
                                      std::vector<BuiltBody> built, Attrs attrs) {
  std::vector<ValueRef> extra;
  for (const BuiltBody& b : built)
    for (const auto& [ref, ph] : b.captured)
      if (std::find(extra.begin(), extra.end(), ref) == extra.end()) extra.push_back(ref);
  std::vector<std::shared_ptr<const Body>> bodies;
  for (BuiltBody& b : built) {
    for (ValueRef ref : extra) {
      int32_t ph = -1;
      for (const auto& [r, p] : b.captured)
        if (r == ref) ph = p;
      b.body->operands.push_back(ph);
    }
    bodies.push_back(std::move(b.body));
  }
  for (ValueRef ref : extra) inputs.emplace_back(&g, ref.node, ref.index);
  return detail::make_node(op, inputs, std::move(attrs), std::move(bodies));
}

std::vector<TensorInfo> infos_of(const std::vector<Tensor>& ts, size_t from = 0) {
  std::vector<TensorInfo> out;
  for (size_t k = from; k < ts.size(); ++k) {
    if (!ts[k].valid()) fail<ValueError>("[control] input {} is an empty Tensor", k);
    out.push_back({ts[k].shape(), ts[k].dtype()});
  }
  return out;
}

}  // namespace

std::vector<Tensor> cond(const Tensor& pred, const std::vector<Tensor>& operands,
                         const BodyFn& then_fn, const BodyFn& else_fn) {
  std::vector<Tensor> inputs{pred};
  inputs.insert(inputs.end(), operands.begin(), operands.end());
  GraphImpl& g = node_graph("cond", inputs);
  const std::vector<TensorInfo> infos = infos_of(inputs, 1);
  std::vector<BuiltBody> built;
  built.push_back(build_body("cond", "then_fn", g, infos, then_fn));
  built.push_back(build_body("cond", "else_fn", g, infos, else_fn));
  return make_control_node(OpId::Cond, std::move(inputs), g, std::move(built), {});
}

std::vector<Tensor> while_loop(const std::vector<Tensor>& init, const BodyFn& cond_fn,
                               const BodyFn& body_fn, const WhileLoopOptions& options) {
  if (init.empty()) fail<ValueError>("[while_loop] takes at least one carried value");
  if (options.max_trip_count < -1)
    fail<ValueError>("[while_loop] max_trip_count must be -1 (none) or at least 0, got {}",
                     options.max_trip_count);
  std::vector<Tensor> inputs = init;
  GraphImpl& g = node_graph("while_loop", inputs);
  const std::vector<TensorInfo> infos = infos_of(inputs);
  std::vector<BuiltBody> built;
  built.push_back(build_body("while_loop", "cond_fn", g, infos, cond_fn));
  built.push_back(build_body("while_loop", "body_fn", g, infos, body_fn));
  Attrs attrs;
  attrs.set("num_carried", static_cast<int64_t>(init.size()))
      .set("max_trip_count", options.max_trip_count);
  return make_control_node(OpId::WhileLoop, std::move(inputs), g, std::move(built),
                           std::move(attrs));
}

std::vector<Tensor> for_loop(const Tensor& n, const std::vector<Tensor>& init,
                             const BodyFn& body_fn) {
  if (init.empty()) fail<ValueError>("[for_loop] takes at least one carried value");
  std::vector<Tensor> inputs{n};
  inputs.insert(inputs.end(), init.begin(), init.end());
  GraphImpl& g = node_graph("for_loop", inputs);
  std::vector<TensorInfo> infos = infos_of(inputs);
  infos[0] = {{}, i64};
  std::vector<BuiltBody> built;
  built.push_back(build_body("for_loop", "body_fn", g, infos, body_fn));
  Attrs attrs;
  attrs.set("num_carried", static_cast<int64_t>(init.size()));
  return make_control_node(OpId::ForLoop, std::move(inputs), g, std::move(built), std::move(attrs));
}

std::vector<Tensor> for_loop(int64_t n, const std::vector<Tensor>& init, const BodyFn& body_fn) {
  if (init.empty() || !init[0].valid())
    fail<ValueError>("[for_loop] takes at least one carried value");
  GraphImpl& g = *init[0].graph_impl();
  Node c;
  c.op = OpId::Constant;
  c.value = Array::scalar(n);
  c.outputs = {{{}, i64}};
  c.name = "trip_count";
  const Tensor count(&g, g.add_inferred(std::move(c)), 0);
  return for_loop(count, init, body_fn);
}

void register_control_ops() {
  // bodies run from the host: never folded or merged (impure). No gradient rules yet: a gradient
  // asked through one is an error naming the op.
  define_op(OpId::Cond).set_infer(infer_cond).not_differentiable().impure().variadic(1, 1 << 20);
  define_op(OpId::WhileLoop)
      .set_infer(infer_while_loop)
      .not_differentiable()
      .impure()
      .variadic(1, 1 << 20);
  define_op(OpId::ForLoop)
      .set_infer(infer_for_loop)
      .not_differentiable()
      .impure()
      .variadic(2, 1 << 20);
}

}  // namespace kiln
