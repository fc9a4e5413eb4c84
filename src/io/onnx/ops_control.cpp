// ONNX control flow onto kiln's control ops (src/ops/control.cpp): If as cond (or, with a
// condition known while importing, the taken branch in place), Loop as a while_loop carrying the
// iteration number and the condition (unrolled while importing where it carries sequences), Scan
// as a for_loop over the scanned axis (Scan-8: inside a for_loop over its batch). A subgraph reads
// the values of the graphs around it by name; kiln captures them. Scan outputs (Loop's and Scan's
// per-iteration values) are stacked into buffers carried through the loop, so their length must be
// known while importing: Scan's scanned dim, Loop's M with a condition that stays true.
#include <onnx/onnx_pb.h>

#include <optional>

#include "core/graph_impl.h"
#include "io/onnx/map_util.h"
#include "kiln/ops/control.h"

namespace kiln::onnx::detail {

namespace {

// The node's outputs from values that may be sequences (set on the node as such).
Outs outputs_of(NodeContext& c, const std::vector<Value>& values) {
  Outs out;
  for (size_t j = 0; j < values.size(); ++j) {
    if (values[j].sequence) c.set_sequence(static_cast<int>(j), *values[j].sequence);
    if (values[j].absent) c.set_absent(static_cast<int>(j));
    out.push_back(values[j].tensor);  // (invalid for a sequence or an absent value)
  }
  return out;
}

bool gives_sequence_or_optional(const ::onnx::GraphProto& g) {
  for (const auto& o : g.output())
    if (o.type().has_sequence_type() || o.type().has_optional_type()) return true;
  return false;
}

Outs if_op(NodeContext& c) {
  if (c.constant(0)) {
    const bool taken = c.ints(0).at(0) != 0;
    return outputs_of(
        c, c.importer().inline_values(c.attr_graph(taken ? "then_branch" : "else_branch"), {}));
  }
  if (gives_sequence_or_optional(c.attr_graph("then_branch")) ||
      gives_sequence_or_optional(c.attr_graph("else_branch")))
    c.needs_values({0},
                   "an If whose branches give sequences or optionals needs its condition "
                   "known while importing (kiln holds those only then)");
  auto branch = [&c](const char* name) {
    return [&c, name](const std::vector<Tensor>&) {
      return c.importer().inline_graph(c.attr_graph(name));
    };
  };
  Tensor pred = c.input(0);
  if (pred.dtype() != boolean) pred = cast(pred, boolean);
  return cond(pred, {}, branch("then_branch"), branch("else_branch"));
}

// The infos of a body's outputs when it reads values of `inputs`' infos: the body mapped once
// onto a graph that is then thrown away (what the buffers of its scan outputs need).
std::vector<TensorInfo> body_output_infos(NodeContext& c, const ::onnx::GraphProto& body,
                                          const std::vector<TensorInfo>& inputs) {
  Graph dry;
  std::vector<Tensor> in;
  for (const TensorInfo& t : inputs) in.push_back(dry.placeholder(t.shape, t.dtype));
  kiln::detail::BodyCapture* around = kiln::detail::BodyCapture::current();
  kiln::detail::BodyCapture scope(dry.impl(), around ? around->body() : c.graph().impl());
  std::vector<TensorInfo> out;
  for (const Tensor& t : c.importer().inline_body(body, in)) out.push_back({t.shape(), t.dtype()});
  return out;
}

// Stacked outputs: a buffer (n, shape...) of zeros per scan output (n computed from shapes as
// the 1-d `length` when it is not known while importing), and the write of one row.
Tensor scan_buffer(NodeContext& c, int64_t n, const TensorInfo& row,
                   const std::optional<Tensor>& length = std::nullopt) {
  for (int64_t d : row.shape)
    if (d < 0)
      c.unsupported(fmt::format(
          "a scan output of shape {} (its dims must be known while importing)", str(row.shape)));
  if (n < 0) return full(concat({*length, known_ints(c, row.shape)}, 0), 0.0, row.dtype);
  Shape s{n};
  s.insert(s.end(), row.shape.begin(), row.shape.end());
  return zeros(c.graph(), s, row.dtype);
}
Tensor write_row(const Tensor& buffer, const Tensor& row_index, Tensor value) {
  if (value.dtype() != buffer.dtype()) value = cast(value, buffer.dtype());
  // (the value has the row's shape; a buffer sized from shapes has no known dims to reshape to)
  return scatter_nd(buffer, reshape(row_index, {1, 1}), expand_dims(value, {0}));
}

// Whether a Loop body hands its condition on unchanged (its output 0 is input 1, or an Identity
// of it): then the loop runs M times.
bool condition_stays(const ::onnx::GraphProto& body) {
  if (body.input_size() < 2 || body.output_size() < 1) return false;
  const std::string& in = body.input(1).name();
  const std::string& out = body.output(0).name();
  if (in == out) return true;
  for (const auto& n : body.node())
    for (const auto& o : n.output())
      if (o == out) return n.op_type() == "Identity" && n.input_size() == 1 && n.input(0) == in;
  return false;
}

// A Loop that carries sequences or optionals, or whose body reads a sequence from around it,
// unrolled while importing (kiln holds those only then): M and the condition after every
// iteration must be known then; each iteration's body is mapped with its iteration number and
// condition as constants. Scan outputs are the iterations' values stacked.
Outs unrolled_loop(NodeContext& c, const ::onnx::GraphProto& body, int carried, int scans) {
  constexpr int64_t kMaxIterations = 4096;
  const int64_t m = c.has_input(0) ? c.ints(0).at(0) : -1;
  bool go = !c.has_input(1) || c.ints(1).at(0) != 0;
  std::vector<Value> state;
  for (int k = 0; k < carried; ++k) state.push_back(c.value(2 + k));
  std::vector<std::vector<Tensor>> rows(static_cast<size_t>(scans));
  for (int64_t i = 0; go && (m < 0 || i < m); ++i) {
    if (i == kMaxIterations || !c.importer().count_unrolled())
      c.unsupported(
          fmt::format("a Loop carrying sequences is unrolled while importing, up to {} "
                      "iterations (and 65,536 bodies in a model)",
                      kMaxIterations));
    std::vector<Value> in{c.importer().value_of(known(c, Array::scalar(i))),
                          c.importer().value_of(known(c, Array::scalar(go)))};
    in.insert(in.end(), state.begin(), state.end());
    const std::vector<Value> out = c.importer().inline_values(body, in);
    if (out[0].sequence || !out[0].data)
      c.unsupported(
          "a Loop carrying sequences is unrolled while importing; the condition its "
          "body gives must be known then");
    go = out[0].data->astype(boolean).to_vector<int64_t>().at(0) != 0;
    for (int k = 0; k < carried; ++k) {
      Value v = out[1 + k];
      if (v.tensor.valid() && state[k].tensor.valid() &&
          v.tensor.dtype() != state[k].tensor.dtype())
        v = {cast(v.tensor, state[k].tensor.dtype()), std::nullopt, std::nullopt};
      // (an optional carried value may go from absent to a value)
      if (!v.absent && !state[k].absent && v.sequence.has_value() != state[k].sequence.has_value())
        c.fail(fmt::format("the body gives a {} for carried value {}, a {}",
                           v.sequence ? "sequence" : "tensor", k,
                           state[k].sequence ? "sequence" : "tensor"));
      state[k] = std::move(v);
    }
    for (int k = 0; k < scans; ++k) {
      const Value& v = out[1 + carried + k];
      if (v.sequence) c.unsupported("a scan output that is a sequence");
      rows[k].push_back(v.tensor);
    }
  }
  Outs outs = outputs_of(c, state);
  for (int k = 0; k < scans; ++k) {
    if (rows[k].empty())
      c.unsupported("the scan outputs of an unrolled Loop that runs no iteration");
    outs.push_back(stack(rows[k], 0));
  }
  return outs;
}

Outs as_while_loop(NodeContext& c, const ::onnx::GraphProto& body, int carried, int scans);

// Loop(M, cond, v...): while (i < M && cond) { cond, v..., scans... = body(i, cond, v...); ++i },
// as a while_loop carrying (i, cond, v..., scan buffers...).
Outs loop_op(NodeContext& c) {
  const ::onnx::GraphProto& body = c.attr_graph("body");
  const int carried = c.num_inputs() - 2;
  if (carried < 0) c.fail("takes M, cond and the carried values");
  const int scans = body.output_size() - 1 - carried;
  if (scans < 0 || body.input_size() != 2 + carried)
    c.fail(fmt::format("the body has {} inputs and {} outputs for {} carried values",
                       body.input_size(), body.output_size(), carried));
  bool sequences = c.importer().reads_outer_sequence(body);
  for (int k = 0; k < carried; ++k)
    sequences = sequences || c.is_sequence(2 + k) || c.is_absent(2 + k);
  if (sequences) return unrolled_loop(c, body, carried, scans);
  // a body that needs, while importing, a value that comes from its iteration number (a slice at
  // the iteration: test_loop11) is unrolled instead, each iteration's number a constant (where M
  // and the condition are known; else the first error stands)
  try {
    return as_while_loop(c, body, carried, scans);
  } catch (const InputValuesNeeded&) {
    throw;  // (values of graph inputs: a session reads them and imports again)
  } catch (const UnsupportedError& e) {
    if (!c.has_input(0) ||
        std::string(e.what()).find("must be known while importing") == std::string::npos)
      throw;
    try {
      return unrolled_loop(c, body, carried, scans);
    } catch (const InputValuesNeeded&) {
      throw;
    } catch (const Error&) {
      throw e;
    }
  }
}

// The Loop as a while_loop carrying (i, cond, v..., scan buffers...).
Outs as_while_loop(NodeContext& c, const ::onnx::GraphProto& body, int carried, int scans) {
  Graph& g = c.graph();
  Tensor go = c.has_input(1) ? c.input(1) : g.constant(Array::scalar(true));
  if (go.dtype() != boolean) go = cast(go, boolean);
  std::vector<Tensor> init{g.constant(Array::scalar(int64_t{0})), reshape(go, {})};
  for (int k = 0; k < carried; ++k) init.push_back(c.input(2 + k));
  if (scans > 0) {
    const bool runs_m_times = c.has_input(0) && c.constant(0) &&
                              (!c.has_input(1) || (c.constant(1) && c.ints(1).at(0) != 0)) &&
                              condition_stays(body);
    if (!runs_m_times) {
      const std::string why =
          "scan outputs need a trip count M known while importing and a condition that stays "
          "true (kiln sizes outputs before a run)";
      if (!condition_stays(body)) c.unsupported(why);
      c.needs_values({0, 1}, why);
    }
    const int64_t n = std::max<int64_t>(c.ints(0).at(0), 0);
    std::vector<TensorInfo> in;
    for (const Tensor& t : init) in.push_back({t.shape(), t.dtype()});
    const std::vector<TensorInfo> out = body_output_infos(c, body, in);
    for (int k = 0; k < scans; ++k) init.push_back(scan_buffer(c, n, out[1 + carried + k]));
  }
  const std::optional<Tensor> m =
      c.has_input(0) ? std::optional<Tensor>(reshape(cast(c.input(0), i64), {})) : std::nullopt;
  auto keep_going = [&](const std::vector<Tensor>& v) {
    if (!m) return std::vector<Tensor>{v[1]};
    return std::vector<Tensor>{logical_and(v[1], less(v[0], *m))};
  };
  auto step = [&](const std::vector<Tensor>& v) {
    const std::vector<Tensor> out =
        c.importer().inline_body(body, std::vector<Tensor>(v.begin(), v.begin() + 2 + carried));
    Tensor next_go = out[0].dtype() == boolean ? out[0] : cast(out[0], boolean);
    std::vector<Tensor> next{v[0] + 1.0, reshape(next_go, {})};
    for (int k = 0; k < carried; ++k) {
      const Tensor& o = out[1 + k];
      next.push_back(o.dtype() == v[2 + k].dtype() ? o : cast(o, v[2 + k].dtype()));
    }
    for (int k = 0; k < scans; ++k)
      next.push_back(write_row(v[2 + carried + k], v[0], out[1 + carried + k]));
    return next;
  };
  const std::vector<Tensor> out = while_loop(init, keep_going, step);
  return Outs(out.begin() + 2, out.end());
}

// Scan (opset 9+): for i < T, states..., outs... = body(states..., x_j[i along axis_j]...), each
// scan input read forwards or backwards, each scan output stacked along its axis.
// Scan's axes and directions, one of each per scan input and per scan output.
struct ScanAxes {
  std::vector<int64_t> in_axes, in_dirs, out_axes, out_dirs;
};

// The scan of `body` over `xs` from the initial `states`: the final states, then the scan outputs.
Outs run_scan(NodeContext& c, const ::onnx::GraphProto& body, std::vector<Tensor> init,
              const std::vector<Tensor>& xs, ScanAxes a) {
  const int states = static_cast<int>(init.size());
  const auto num_scan = static_cast<int>(xs.size());
  const int scans = body.output_size() - states;
  int64_t steps = -1;
  bool known = true;
  for (int j = 0; j < num_scan; ++j) {
    a.in_axes[j] = axis_of(c, a.in_axes[j], xs[j].rank());
    const int64_t len = xs[j].dim(static_cast<int>(a.in_axes[j]));
    known = known && len >= 0;
    if (len >= 0 && steps >= 0 && len != steps)
      c.fail(fmt::format("scan inputs of {} and {} steps", steps, len));
    if (len >= 0) steps = len;
  }
  // the trip count: known while importing, or the first scan input's scanned dim, from shapes
  std::optional<Tensor> length;
  if (!known) {
    steps = -1;
    length = slice(shape_of(xs[0]), {a.in_axes[0]}, {a.in_axes[0] + 1});
  }
  const Tensor count =
      known ? known_ints(c, {steps}) : *length;  // 1-d; reshaped to the loop's 0-d count below
  // a body over (states..., one step of each scan input)
  std::vector<TensorInfo> in;
  for (const Tensor& s : init) in.push_back({s.shape(), s.dtype()});
  for (int j = 0; j < num_scan; ++j) {
    Shape s = xs[j].shape();
    s.erase(s.begin() + a.in_axes[j]);
    in.push_back({s, xs[j].dtype()});
  }
  const std::vector<TensorInfo> out_infos = body_output_infos(c, body, in);
  for (int k = 0; k < scans; ++k)
    init.push_back(scan_buffer(c, steps, out_infos[states + k], length));
  if (init.empty()) return {};
  const Tensor trips = reshape(count, {});
  auto step_index = [&](const Tensor& i, int64_t reverse) {
    return reverse ? (trips - 1.0) - i : i;
  };
  std::vector<Tensor> out = for_loop(trips, init, [&](const std::vector<Tensor>& v) {
    std::vector<Tensor> args(v.begin() + 1, v.begin() + 1 + states);
    for (int j = 0; j < num_scan; ++j)
      args.push_back(gather(xs[j], step_index(v[0], a.in_dirs[j]), a.in_axes[j]));
    const std::vector<Tensor> o = c.importer().inline_body(body, args);
    std::vector<Tensor> next;
    for (int k = 0; k < states; ++k)
      next.push_back(o[k].dtype() == v[1 + k].dtype() ? o[k] : cast(o[k], v[1 + k].dtype()));
    for (int k = 0; k < scans; ++k)
      next.push_back(write_row(v[1 + states + k], step_index(v[0], a.out_dirs[k]), o[states + k]));
    return next;
  });
  for (int k = 0; k < scans; ++k) {
    Tensor& y = out[states + k];
    const int64_t axis = axis_of(c, a.out_axes[k], y.rank());
    if (axis == 0) continue;
    std::vector<int64_t> perm;
    for (int64_t d = 1; d < y.rank(); ++d) perm.push_back(d);
    perm.insert(perm.begin() + axis, 0);
    y = transpose(y, perm);
  }
  return out;
}

// The body's counts checked against the node's: `first` inputs before the states.
int scan_outputs(NodeContext& c, const ::onnx::GraphProto& body, int first, int64_t num_scan) {
  const int states = c.num_inputs() - first - static_cast<int>(num_scan);
  if (num_scan < 1 || states < 0)
    c.fail(fmt::format("num_scan_inputs {} does not fit {} inputs", num_scan, c.num_inputs()));
  const int scans = body.output_size() - states;
  if (scans < 0 || body.input_size() != c.num_inputs() - first)
    c.fail(fmt::format("the body has {} inputs and {} outputs for {} states and {} scan inputs",
                       body.input_size(), body.output_size(), states, num_scan));
  return scans;
}

// One value per input or output of the attribute `name` (all 0 when it is not given).
std::vector<int64_t> per_value(NodeContext& c, const char* name, int64_t count) {
  std::vector<int64_t> v = c.attr_ints(name);
  if (v.empty()) v.assign(static_cast<size_t>(count), 0);
  if (static_cast<int64_t>(v.size()) != count)
    c.fail(fmt::format("{} has {} values for {}", name, v.size(), count));
  return v;
}

Outs scan_op(NodeContext& c) {
  const ::onnx::GraphProto& body = c.attr_graph("body");
  const int64_t num_scan = c.required_int("num_scan_inputs");
  const int scans = scan_outputs(c, body, 0, num_scan);
  const int states = c.num_inputs() - static_cast<int>(num_scan);
  std::vector<Tensor> init, xs;
  for (int k = 0; k < states; ++k) init.push_back(c.input(k));
  for (int j = 0; j < num_scan; ++j) xs.push_back(c.input(states + j));
  return run_scan(
      c, body, init, xs,
      {per_value(c, "scan_input_axes", num_scan), per_value(c, "scan_input_directions", num_scan),
       per_value(c, "scan_output_axes", scans), per_value(c, "scan_output_directions", scans)});
}

// Scan-8: every state and scan input has a batch dim first (the scanned dim second), and the
// body sees one batch element. A for_loop over the batch scans each element with its own inner
// for_loop and writes its results into rows of the outputs. sequence_lens may only give every
// element the whole length.
Outs scan8_op(NodeContext& c) {
  const ::onnx::GraphProto& body = c.attr_graph("body");
  const int64_t num_scan = c.required_int("num_scan_inputs");
  const int scans = scan_outputs(c, body, 1, num_scan);
  const int states = c.num_inputs() - 1 - static_cast<int>(num_scan);
  int64_t batch = -1;
  for (int i = 1; i < c.num_inputs(); ++i) {
    const Tensor x = c.input(i);
    if (x.rank() < (i > states ? 2 : 1))
      c.fail(fmt::format("input {} of rank {} has no batch dim{}", i, x.rank(),
                         i > states ? " and scanned dim" : ""));
    if (batch >= 0 && x.dim(0) >= 0 && x.dim(0) != batch)
      c.fail(fmt::format("inputs with batch dims {} and {}", batch, x.dim(0)));
    if (x.dim(0) >= 0) batch = x.dim(0);
  }
  const Tensor first = c.input(1 + states);  // (the first scan input: batch and steps)
  if (c.has_input(0)) {
    const int64_t steps = first.dim(1);
    for (int64_t len : c.ints(0))
      if (len != steps)
        c.unsupported(
            fmt::format("sequence_lens holds {} for sequences of {} steps: only "
                        "whole-length sequences are supported",
                        len, steps));
  }
  // a dim of the first scan input, 1-d: known while importing or from its shape
  auto dim_of = [&](int d) {
    return first.dim(d) >= 0 ? known_ints(c, {first.dim(d)})
                             : slice(shape_of(first), {int64_t{d}}, {int64_t{d} + 1});
  };
  // the outputs: the states' rows overwritten, the scan outputs (batch, steps, row...) of zeros
  std::vector<TensorInfo> step_in;
  std::vector<Tensor> init;
  for (int k = 0; k < states; ++k) {
    const Tensor s = c.input(1 + k);
    init.push_back(s);
    const Shape shape = s.shape();
    step_in.push_back({Shape(shape.begin() + 1, shape.end()), s.dtype()});
  }
  for (int j = 0; j < num_scan; ++j) {
    const Tensor x = c.input(1 + states + j);
    const Shape shape = x.shape();
    step_in.push_back({Shape(shape.begin() + 2, shape.end()), x.dtype()});
  }
  const std::vector<TensorInfo> out_infos = body_output_infos(c, body, step_in);
  for (int k = 0; k < scans; ++k) {
    const TensorInfo& row = out_infos[states + k];
    for (int64_t d : row.shape)
      if (d < 0)
        c.unsupported(fmt::format(
            "a scan output of shape {} (its dims must be known while importing)", str(row.shape)));
    Shape s{batch, first.dim(1)};
    s.insert(s.end(), row.shape.begin(), row.shape.end());
    init.push_back(is_static(s) ? zeros(c.graph(), s, row.dtype)
                                : full(concat({dim_of(0), dim_of(1), known_ints(c, row.shape)}, 0),
                                       0.0, row.dtype));
  }
  const std::vector<int64_t> dirs = per_value(c, "directions", num_scan);
  const Tensor steps = reshape(dim_of(1), {});
  // rows: the outer loop over the batch; for each, the inner loop over the steps writes each
  // step's outputs at [b, t] and carries the element's states, written into row b at its end
  return for_loop(reshape(dim_of(0), {}), init, [&](const std::vector<Tensor>& v) {
    const Tensor& b = v[0];
    std::vector<Tensor> inner;
    for (int k = 0; k < states; ++k) inner.push_back(gather(v[1 + k], b, 0));
    for (int k = 0; k < scans; ++k) inner.push_back(v[1 + states + k]);
    std::vector<Tensor> xs;
    for (int j = 0; j < num_scan; ++j) xs.push_back(gather(c.input(1 + states + j), b, 0));
    const std::vector<Tensor> done = for_loop(steps, inner, [&](const std::vector<Tensor>& u) {
      const Tensor& t = u[0];
      std::vector<Tensor> args(u.begin() + 1, u.begin() + 1 + states);
      for (int j = 0; j < num_scan; ++j)
        args.push_back(gather(xs[j], dirs[j] ? (steps - 1.0) - t : t, 0));
      const std::vector<Tensor> o = c.importer().inline_body(body, args);
      std::vector<Tensor> next;
      for (int k = 0; k < states; ++k)
        next.push_back(o[k].dtype() == u[1 + k].dtype() ? o[k] : cast(o[k], u[1 + k].dtype()));
      const Tensor at = reshape(stack({b, t}, 0), {1, 2});
      for (int k = 0; k < scans; ++k) {
        const Tensor& buf = u[1 + states + k];
        const Tensor& y = o[states + k];
        next.push_back(scatter_nd(
            buf, at, expand_dims(y.dtype() == buf.dtype() ? y : cast(y, buf.dtype()), {0})));
      }
      return next;
    });
    std::vector<Tensor> next;
    for (int k = 0; k < states; ++k) next.push_back(write_row(v[1 + k], b, done[k]));
    for (int k = 0; k < scans; ++k) next.push_back(done[states + k]);
    return next;
  });
}

}  // namespace

void add_control_ops(std::vector<OpEntry>& t) {
  t.insert(t.end(), {
                        {"If", 1, if_op},
                        {"Loop", 1, loop_op},
                        {"Scan", 8, scan8_op},
                        {"Scan", 9, scan_op},
                    });
}

}  // namespace kiln::onnx::detail
