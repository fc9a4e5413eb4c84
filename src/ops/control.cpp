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
#include "kiln/autodiff.h"
#include "kiln/ops/core.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/transform.h"
#include "ops/common.h"
#include "ops/control_ops.h"

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

// ---- gradients

// The body's results computed again from `operands` on the graph being built (the body around
// this call, or the operands' graph): the nodes the results need, copied with operand k in place
// of the body's placeholder k.
std::vector<Tensor> replay_body(const Body& b, std::vector<Tensor> operands) {
  detail::BodyCapture* scope = detail::BodyCapture::current();
  GraphImpl& g = scope ? scope->body() : *operands.at(0).graph_impl();
  if (scope)
    for (Tensor& t : operands) t = scope->capture(t, "gradients");
  const auto& nodes = b.graph.nodes;
  std::vector<char> needed(nodes.size(), 0);
  for (ValueRef r : b.results) needed[r.node] = 1;
  for (size_t i = nodes.size(); i-- > 0;)
    if (needed[i])
      for (ValueRef v : nodes[i].inputs) needed[v.node] = 1;
  std::vector<int32_t> map(nodes.size(), -1);
  for (size_t k = 0; k < b.operands.size(); ++k)
    if (b.operands[k] >= 0) map[b.operands[k]] = -2 - static_cast<int32_t>(k);
  auto value = [&](ValueRef v) -> ValueRef {
    const int32_t m = map[v.node];
    if (m <= -2) return {operands[-2 - m].node_id(), operands[-2 - m].output_index()};
    return {m, v.index};
  };
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (!needed[i] || map[i] <= -2) continue;
    if (n.inputs.empty()) {  // constants and other sources: as they are
      Node copy = n;
      copy.origin = -1;
      map[i] = g.add_inferred(std::move(copy));
      continue;
    }
    std::vector<ValueRef> in;
    for (ValueRef v : n.inputs) in.push_back(value(v));
    map[i] = g.add(n.op, std::move(in), n.attrs, n.name, n.bodies);
  }
  std::vector<Tensor> out;
  for (ValueRef r : b.results) {
    const ValueRef v = value(r);
    out.emplace_back(&g, v.node, v.index);
  }
  return out;
}

}  // namespace

std::shared_ptr<const Body> while_step_body(const Body& cond, const Body& body,
                                            const std::vector<TensorInfo>& operands,
                                            size_t carried) {
  if (carried == 0 || operands.size() != body.operands.size()) return nullptr;
  auto step = std::make_shared<Body>(body);
  GraphImpl& g = step->graph;
  // the condition's operands: the body's results for the carried values, the captured as they are
  std::vector<Tensor> args;
  for (size_t k = 0; k < operands.size(); ++k) {
    if (k < carried) {
      args.emplace_back(&g, body.results[k].node, body.results[k].index);
      continue;
    }
    if (step->operands[k] < 0) {  // captured by the condition only: a placeholder for it here
      Node n;
      n.op = OpId::Placeholder;
      n.outputs = {operands[k]};
      n.name = fmt::format("step.operand{}", k);
      n.attrs.set("shape", operands[k].shape).set("dtype", operands[k].dtype);
      step->operands[k] = g.add_inferred(std::move(n));
    }
    args.emplace_back(&g, step->operands[k], 0);
  }
  const Tensor c = replay_body(cond, args).at(0);
  step->results.push_back({c.node_id(), c.output_index()});
  return step;
}

namespace {

// sum_k sum(results[k] * cts[k]) over the results that receive a cotangent: a scalar whose
// gradient with respect to the body's operands is the body's vector-Jacobian product.
Tensor weighted(const std::vector<Tensor>& results, const std::vector<size_t>& which,
                const std::vector<Tensor>& cts) {
  std::optional<Tensor> y;
  for (size_t j = 0; j < which.size(); ++j) {
    const Tensor t = sum(results[which[j]] * cts[j]);
    y = y ? *y + t : t;
  }
  return *y;
}

std::vector<std::optional<Tensor>> vjp_cond(const VjpContext& ctx) {
  const std::vector<Tensor> operands(ctx.inputs.begin() + 1, ctx.inputs.end());
  std::vector<size_t> with_ct, diff;
  std::vector<Tensor> args = operands;
  for (size_t k = 0; k < ctx.cotangents.size(); ++k)
    if (ctx.cotangents[k]) {
      with_ct.push_back(k);
      args.push_back(*ctx.cotangents[k]);
    }
  for (size_t k = 0; k < operands.size(); ++k)
    if (is_floating(operands[k].dtype())) diff.push_back(k);
  std::vector<std::optional<Tensor>> grads(ctx.inputs.size());
  if (diff.empty()) return grads;
  // a cond over the branches' gradients, on the same predicate
  auto branch = [&](size_t which) {
    return [&, which](const std::vector<Tensor>& a) {
      const std::vector<Tensor> ops(a.begin(), a.begin() + operands.size());
      const std::vector<Tensor> cts(a.begin() + operands.size(), a.end());
      const Tensor y = weighted(replay_body(*ctx.bodies.at(which), ops), with_ct, cts);
      std::vector<Tensor> xs;
      for (size_t k : diff) xs.push_back(ops[k]);
      return gradients(y, xs);
    };
  };
  const std::vector<Tensor> g = cond(ctx.inputs[0], args, branch(0), branch(1));
  for (size_t j = 0; j < diff.size(); ++j) grads[1 + diff[j]] = g[j];
  return grads;
}

// A buffer of `rows` rows of t's shape, zeros, on t's graph.
Tensor rows_like(const Tensor& t, int64_t rows) {
  Shape s = t.shape();
  if (!is_static(s))
    fail<UnsupportedError>("[for_loop] gradients need carried values of static shapes, got {}",
                           str(s));
  s.insert(s.begin(), rows);
  return detail::make_source_node(*t.graph_impl(), OpId::Full,
                                  {{"shape", s}, {"value", 0.0}, {"dtype", t.dtype()}})[0];
}
Tensor write_row(const Tensor& buffer, const Tensor& row, const Tensor& value) {
  Shape s = value.shape();
  s.insert(s.begin(), 1);
  return scatter_nd(buffer, reshape(row, {1, 1}), reshape(value, s));
}

// The parts of a loop node its gradient reads: the carried and captured inputs and the body,
// whose operands are (i, carried..., captured...) for for_loop, (carried..., captured...) for
// while_loop.
struct LoopParts {
  std::vector<Tensor> carried, captured;
  const Body* body = nullptr;
  size_t first = 0;  // the node input of carried value 0
  bool counter = false;
  std::vector<Tensor> operands(const std::optional<Tensor>& i, const std::vector<Tensor>& c) const {
    std::vector<Tensor> ops;
    if (counter) ops.push_back(*i);
    ops.insert(ops.end(), c.begin(), c.end());
    ops.insert(ops.end(), captured.begin(), captured.end());
    return ops;
  }
};

LoopParts loop_parts(const VjpContext& ctx, bool counter) {
  const size_t first = counter ? 1 : 0;
  const auto nc = static_cast<size_t>(ctx.attrs.i("num_carried"));
  LoopParts l;
  l.carried.assign(ctx.inputs.begin() + first, ctx.inputs.begin() + first + nc);
  l.captured.assign(ctx.inputs.begin() + first + nc, ctx.inputs.end());
  l.body = ctx.bodies.at(counter ? 0 : 1).get();
  l.first = first;
  l.counter = counter;
  return l;
}

Tensor int64_zero(const Tensor& like) {
  return detail::make_source_node(*like.graph_impl(), OpId::Full,
                                  {{"shape", Shape{}}, {"value", 0.0}, {"dtype", i64}})[0];
}

// The backward of a loop whose forward kept the carried values each iteration started from in
// `history` (rows 0 .. trips-1): a while_loop over j < trips that runs the body's
// vector-Jacobian product at row trips-1-j, carrying the carried values' cotangents and summing
// the captured values' gradients.
std::vector<std::optional<Tensor>> loop_backward(const VjpContext& ctx, const LoopParts& l,
                                                 const std::vector<Tensor>& history,
                                                 const Tensor& trips) {
  const size_t nc = l.carried.size();
  std::vector<size_t> dc, dcap;
  for (size_t k = 0; k < nc; ++k)
    if (is_floating(l.carried[k].dtype())) dc.push_back(k);
  for (size_t k = 0; k < l.captured.size(); ++k)
    if (is_floating(l.captured[k].dtype())) dcap.push_back(k);
  std::vector<std::optional<Tensor>> grads(ctx.inputs.size());
  if (dc.empty()) return grads;
  std::vector<Tensor> init{int64_zero(trips)};
  for (size_t k : dc) init.push_back(ctx.cotangent_or_zeros(static_cast<int>(k)));
  for (size_t k : dcap) init.push_back(zeros_like(l.captured[k]));
  const std::vector<Tensor> back = while_loop(
      init, [&](const std::vector<Tensor>& v) { return std::vector<Tensor>{less(v[0], trips)}; },
      [&](const std::vector<Tensor>& v) {
        const Tensor i = trips - 1.0 - v[0];
        std::vector<Tensor> c;
        for (size_t k = 0; k < nc; ++k) c.push_back(gather(history[k], i, 0));
        std::vector<Tensor> ops = l.operands(i, c);
        detail::BodyCapture& scope = *detail::BodyCapture::current();
        for (Tensor& t : ops) t = scope.capture(t, "gradients");
        const std::vector<Tensor> cts(v.begin() + 1, v.begin() + 1 + dc.size());
        const Tensor y = weighted(replay_body(*l.body, ops), dc, cts);
        const size_t at = l.counter ? 1 : 0;  // carried value 0 among the operands
        std::vector<Tensor> xs;
        for (size_t k : dc) xs.push_back(ops[at + k]);
        for (size_t k : dcap) xs.push_back(ops[at + nc + k]);
        std::vector<Tensor> g = gradients(y, xs);
        for (size_t j = 0; j < dcap.size(); ++j)
          g[dc.size() + j] = v[1 + dc.size() + j] + g[dc.size() + j];
        g.insert(g.begin(), v[0] + 1.0);
        return g;
      });
  for (size_t j = 0; j < dc.size(); ++j) grads[l.first + dc[j]] = back[1 + j];
  for (size_t j = 0; j < dcap.size(); ++j) grads[l.first + nc + dcap[j]] = back[1 + dc.size() + j];
  return grads;
}

// for_loop with a trip count known when the graph is built: the forward runs again keeping every
// iteration's carried values (trip count rows each), then the backward.
std::vector<std::optional<Tensor>> vjp_for_loop(const VjpContext& ctx) {
  const Tensor& n = ctx.inputs[0];
  const Node& count = n.graph_impl()->nodes[n.node_id()];
  if (count.op != OpId::Constant)
    fail<UnsupportedError>(
        "[for_loop] gradients need a trip count known when the graph is built "
        "(for_loop(int64_t n, ...)); this one is {} node %{}",
        op_name(count.op), n.node_id());
  const int64_t steps = std::max<int64_t>(count.value.astype(i64).data<int64_t>()[0], 0);
  const LoopParts l = loop_parts(ctx, true);
  const size_t nc = l.carried.size();
  std::vector<Tensor> init = l.carried;
  for (const Tensor& c : l.carried) init.push_back(rows_like(c, steps));
  const std::vector<Tensor> kept = for_loop(n, init, [&](const std::vector<Tensor>& v) {
    const std::vector<Tensor> c(v.begin() + 1, v.begin() + 1 + nc);
    std::vector<Tensor> next = replay_body(*l.body, l.operands(v[0], c));
    for (size_t k = 0; k < nc; ++k) next.push_back(write_row(v[1 + nc + k], v[0], c[k]));
    return next;
  });
  const Tensor trips = detail::make_source_node(
      *n.graph_impl(), OpId::Full,
      {{"shape", Shape{}}, {"value", static_cast<double>(steps)}, {"dtype", i64}})[0];
  return loop_backward(ctx, l, std::vector<Tensor>(kept.begin() + nc, kept.end()), trips);
}

// while_loop with max_trip_count: the forward runs again counting its iterations and keeping
// each one's carried values (max_trip_count rows each), then the backward over the count.
std::vector<std::optional<Tensor>> vjp_while_loop(const VjpContext& ctx) {
  const int64_t max_trips = ctx.attrs.i("max_trip_count", -1);
  if (max_trips < 0)
    fail<UnsupportedError>(
        "[while_loop] gradients need max_trip_count (the forward keeps that "
        "many rows of each carried value for the backward)");
  const LoopParts l = loop_parts(ctx, false);
  const Body& keep_going = *ctx.bodies.at(0);
  const size_t nc = l.carried.size();
  std::vector<Tensor> init = l.carried;
  init.push_back(int64_zero(l.carried[0]));
  for (const Tensor& c : l.carried) init.push_back(rows_like(c, max_trips));
  WhileLoopOptions o;
  o.max_trip_count = max_trips;
  const std::vector<Tensor> kept = while_loop(
      init,
      [&](const std::vector<Tensor>& v) {
        return replay_body(
            keep_going, l.operands(std::nullopt, std::vector<Tensor>(v.begin(), v.begin() + nc)));
      },
      [&](const std::vector<Tensor>& v) {
        const std::vector<Tensor> c(v.begin(), v.begin() + nc);
        std::vector<Tensor> next = replay_body(*l.body, l.operands(std::nullopt, c));
        next.push_back(v[nc] + 1.0);
        for (size_t k = 0; k < nc; ++k) next.push_back(write_row(v[nc + 1 + k], v[nc], c[k]));
        return next;
      },
      o);
  return loop_backward(ctx, l, std::vector<Tensor>(kept.begin() + nc + 1, kept.end()), kept[nc]);
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

size_t num_bodies(OpId op) {
  switch (op) {
    case OpId::Cond:
    case OpId::WhileLoop:
      return 2;
    case OpId::ForLoop:
      return 1;
    default:
      return 0;
  }
}

void register_control_ops() {
  // bodies run from the host: never folded or merged (impure)
  define_op(OpId::Cond).set_infer(infer_cond).grad(vjp_cond).impure().variadic(1, 1 << 20);
  define_op(OpId::WhileLoop)
      .set_infer(infer_while_loop)
      .grad(vjp_while_loop)
      .impure()
      .variadic(1, 1 << 20);
  define_op(OpId::ForLoop)
      .set_infer(infer_for_loop)
      .grad(vjp_for_loop)
      .impure()
      .variadic(2, 1 << 20);
}

}  // namespace kiln
