// cond, while_loop and for_loop at run time. Each body is an executable of its own, compiled with
// the outer executable for its device and options at the shapes of the node's inputs.
//
// Run step by step, the node's kernel runs on the host: it reads the predicate (or the trip
// count), runs the body's executable on the outer run's stream with the operands as feeds (no
// copy), and copies the last results into the node's outputs. On a GPU that is one wait for the
// stream per body run (and per predicate read): the loop is driven from the host.
//
// Recorded into a run (a CUDA graph, recording_in_progress), the node becomes a conditional node
// and the loop stays on the device: the bodies' steps are recorded into the node's body graphs,
// with buffers of the recording, and a one-thread kernel sets the condition from the predicate
// (or the device counter against the trip count) before the node and at the end of each body.
#include "runtime/control.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "core/device_backend.h"
#include "core/errors.h"
#include "core/op_registry.h"
#include "ops/control_ops.h"
#include "runtime/device_run.h"
#include "runtime/env.h"
#include "runtime/executor.h"
#include "runtime/profiler.h"

namespace kiln::detail {

namespace {

struct CompiledBody {
  std::shared_ptr<ExecutableImpl> exe;
  std::vector<int32_t> feed_node;  // per operand: the body program's placeholder (-1: unread)
};

struct ControlBodies final : OpParams {
  std::vector<CompiledBody> bodies;
};

// Where a control kernel runs: the CPU (b null) or a device stream.
struct Place {
  Device device;
  DeviceBackend* b = nullptr;
  void* stream = nullptr;
};

Place place_of(const KernelContext& ctx, Backend backend) {
  if (backend == Backend::cpu) return {};
  const Device d = Device::cuda(ctx.device());
  return {d, backend_of(d), ctx.stream()};
}

// A view of the outer run as an Array of its device (not owned: the run keeps it alive).
Array wrap(const TensorView& v, const Place& w) {
  auto st = std::make_shared<Storage>();
  st->data = v.data;
  st->bytes = static_cast<size_t>(v.numel()) * size_of(v.dtype);
  st->device = w.b ? w.device : Device::cpu();
  return Array::adopt(std::move(st), v.shape, v.dtype);
}

std::vector<Array> run_body(const CompiledBody& body, const std::vector<Array>& operands,
                            const Place& w) {
  std::vector<const Array*> feeds(body.exe->program.graph.nodes.size(), nullptr);
  for (size_t k = 0; k < body.feed_node.size(); ++k)
    if (body.feed_node[k] >= 0) feeds[body.feed_node[k]] = &operands[k];
  return w.b ? run_device(*body.exe, feeds, w.stream) : run_cpu(*body.exe, feeds);
}

// The one element of `a` (a predicate or a trip count) on the host: a copy and a wait on a GPU.
Array to_host(const Array& a, const Place& w) {
  if (!w.b) return a;
  Array h = Array::empty(a.shape(), a.dtype());
  w.b->copy_async(w.device.index, h.data(), true, a.data(), false, a.nbytes(), w.stream);
  w.b->synchronize(w.device.index, w.stream);
  return h;
}
bool read_bool(const Array& a, const Place& w) {
  return *static_cast<const bool*>(to_host(a, w).data());
}
int64_t read_int(const Array& a, const Place& w) {
  return to_host(a, w).astype(i64).data<int64_t>()[0];
}

void copy_out(const Array& from, const TensorView& to, const Place& w) {
  const size_t bytes = static_cast<size_t>(to.numel()) * size_of(to.dtype);
  if (bytes == 0 || from.data() == to.data) return;
  if (!w.b) std::memcpy(to.data, from.data(), bytes);
  else w.b->copy_async(w.device.index, to.data, false, from.data(), false, bytes, w.stream);
}

const ControlBodies& bodies_of(const KernelContext& ctx) {
  KILN_ASSERT(ctx.params());
  return params_as<ControlBodies>(*ctx.params());
}

std::vector<Array> inputs_of(const KernelContext& ctx, const Place& w, int from) {
  std::vector<Array> out;
  for (int k = from; k < ctx.num_inputs(); ++k) out.push_back(wrap(ctx.in(k), w));
  return out;
}

// ---- Recorded as conditional nodes ----

using Recording = ExecutableImpl::Recording;
using Update = DeviceBackend::ConditionUpdate;

size_t bytes_of(const TensorView& v) { return static_cast<size_t>(v.numel()) * size_of(v.dtype); }
bool overlap(const TensorView& a, const TensorView& b) {
  const char *p = static_cast<const char*>(a.data), *q = static_cast<const char*>(b.data);
  return bytes_of(a) && bytes_of(b) && p < q + bytes_of(b) && q < p + bytes_of(a);
}

// A control op being recorded: its values in buffers of the recording, its bodies' steps
// recorded on a given stream.
struct Recorder {
  Recording& rec;
  const Place& w;

  DeviceBackend& b() const { return *w.b; }
  int dev() const { return w.device.index; }
  TensorView buffer(const Shape& shape, DType t) {
    rec.buffers.push_back(device_array(*w.b, w.device, shape, t, rec.stream));
    return {rec.buffers.back().data(), shape, t};
  }
  std::vector<TensorView> body(const CompiledBody& c, const std::vector<TensorView>& operands,
                               void* stream) {
    std::vector<const void*> feeds(c.exe->program.graph.nodes.size(), nullptr);
    for (size_t k = 0; k < c.feed_node.size(); ++k)
      if (c.feed_node[k] >= 0) feeds[c.feed_node[k]] = operands[k].data;
    return record_body(c.exe, rec, stream, feeds);
  }
  // from[k] into to[k] for every k, as if all were read before any is written: a source that
  // some destination overlaps is first copied into a buffer on `stream` (a body that swaps two
  // carried values returns each one's operand as the other's result). Returns the copies left
  // to make.
  std::vector<DeviceBackend::DeviceCopy> copies(const std::vector<TensorView>& from,
                                                const std::vector<TensorView>& to, void* stream) {
    std::vector<DeviceBackend::DeviceCopy> out;
    for (size_t k = 0; k < from.size(); ++k) {
      if (from[k].data == to[k].data || !bytes_of(to[k])) continue;
      const void* src = from[k].data;
      bool staged = false;
      for (const TensorView& d : to) staged = staged || overlap(from[k], d);
      if (staged) src = stage(from[k], stream).data;
      out.push_back({to[k].data, src, bytes_of(to[k])});
    }
    return out;
  }
  // A copy of `v` in a buffer of the recording, made on `stream`.
  TensorView stage(const TensorView& v, void* stream) {
    const TensorView t = buffer(v.shape, v.dtype);
    b().copy_async(dev(), t.data, false, v.data, false, bytes_of(v), stream);
    return t;
  }
  void copy_all(const std::vector<TensorView>& from, const std::vector<TensorView>& to,
                void* stream) {
    for (const auto& c : copies(from, to, stream))
      b().copy_async(dev(), c.dst, false, c.src, false, c.bytes, stream);
  }
  // The node's outputs as the loop's carried values, unless one shares bytes with an input (then
  // buffers of the recording, copied out after the loop by carried_out).
  std::vector<TensorView> carried_state(const KernelContext& ctx) {
    bool own = false;
    for (int k = 0; k < ctx.num_outputs(); ++k)
      for (int j = 0; j < ctx.num_inputs(); ++j) own = own || overlap(ctx.out(k), ctx.in(j));
    std::vector<TensorView> state;
    for (int k = 0; k < ctx.num_outputs(); ++k)
      state.push_back(own ? buffer(ctx.out(k).shape, ctx.out(k).dtype) : ctx.out(k));
    return state;
  }
  void carried_out(const KernelContext& ctx, const std::vector<TensorView>& state) {
    std::vector<TensorView> outs;
    for (int k = 0; k < ctx.num_outputs(); ++k) outs.push_back(ctx.out(k));
    copy_all(state, outs, w.stream);  // (nothing where the state is the outputs)
  }
};

// A stream recording into a conditional node's body, ended however the recording goes.
class BodyStream {
 public:
  BodyStream(DeviceBackend& b, int dev, void* graph)
      : b_(b), dev_(dev), stream_(b.begin_body(dev, graph)) {}
  ~BodyStream() {
    if (!stream_) return;
    try {
      b_.end_body(dev_, stream_);
    } catch (...) {  // (the recording is failing already)
    }
  }
  BodyStream(const BodyStream&) = delete;
  BodyStream& operator=(const BodyStream&) = delete;
  void* stream() const { return stream_; }
  void end() {
    void* s = stream_;
    stream_ = nullptr;
    b_.end_body(dev_, s);
  }

 private:
  DeviceBackend& b_;
  int dev_;
  void* stream_;
};

// How many loop steps one launch of a conditional node's body runs (docs/control-flow.md). A
// body's steps recorded one after another save the node's relaunch of its body (about 3.5 us on
// an H100, the time of three or four small kernels) on all but one of them. Small bodies only:
// up to 16 steps for a body of up to 2 kernels, 8 for up to 4, 4 for up to 16, one otherwise
// (KILN_LOOP_UNROLL sets the most; a WHILE node over 8 one-kernel steps measured 1.46 us a step
// on an H100, over 16 1.21, over 32 1.10); each step has buffers of its own, at most 64 MiB over
// one launch's steps. The steps of a while_loop's last launch that follow its end still run (their
// results are not taken), so `speculative` bodies must be free of effects: pure ops, no kernel that
// reports errors (an index out of range past the end), no custom ops, no nested loops. (A recorded
// body has no step on the CPU: capture_blocker.)
int steps_per_launch(const CompiledBody& c, bool speculative) {
  const ExecutableImpl& x = *c.exe;
  int most = env::loop_unroll();
  if (most <= 0)
    most = x.steps.size() <= 2 ? 16 : x.steps.size() <= 4 ? 8 : x.steps.size() <= 16 ? 4 : 1;
  most = std::clamp(most, 1, DeviceBackend::kMaxLoopSteps);
  const auto& nodes = x.program.graph.nodes;
  if (speculative && x.reports_errors) return 1;
  for (const Step& st : x.steps) {
    const Node& n = nodes[st.node];
    if (!n.bodies.empty()) return 1;
    if (speculative && (!op_def(n.op).pure || n.op == OpId::Custom)) return 1;
  }
  size_t bytes = x.plan.arena_bytes;
  for (size_t k = 0; k < x.program.num_returned; ++k) {
    const ValueRef v = x.program.outputs[k];
    const TensorInfo& t = nodes[v.node].outputs[v.index];
    bytes += static_cast<size_t>(numel(t.shape)) * size_of(t.dtype);
  }
  constexpr size_t kMaxBytes = size_t{64} << 20;
  while (most > 1 && bytes * static_cast<size_t>(most) > kMaxBytes) --most;
  return most;
}

std::vector<TensorView> inputs_from(const KernelContext& ctx, int from, int to) {
  std::vector<TensorView> v;
  for (int k = from; k < to; ++k) v.push_back(ctx.in(k));
  return v;
}

// cond as an IF node with an else body; each branch ends by copying its results into the node's
// outputs.
void record_cond(KernelContext& ctx, Recorder& r) {
  const auto& bodies = bodies_of(ctx).bodies;
  const uint64_t h = r.b().create_condition(r.dev(), r.w.stream);
  Update u;
  u.value = ctx.in(0).data;
  r.b().set_condition(r.dev(), r.w.stream, h, u);
  const std::vector<void*> graphs = r.b().add_conditional(r.dev(), r.w.stream, h, false, 2);
  const std::vector<TensorView> operands = inputs_from(ctx, 1, ctx.num_inputs());
  std::vector<TensorView> outs;
  for (int k = 0; k < ctx.num_outputs(); ++k) outs.push_back(ctx.out(k));
  for (int branch = 0; branch < 2; ++branch) {
    BodyStream s(r.b(), r.dev(), graphs[branch]);
    r.copy_all(r.body(bodies[branch], operands, s.stream()), outs, s.stream());
    s.end();
  }
}

// `steps` steps of a while_loop (its step body: results, then the condition on them) recorded
// one after another in one body run, each on the previous one's results; the condition's kernel
// finds the first false predicate, copies the results of that step (all of them true: the last)
// into the carried values, and holds while all were true.
void record_while_steps(Recorder& r, const CompiledBody& step, std::vector<TensorView> operands,
                        const std::vector<TensorView>& state, int steps, Update u, uint64_t h,
                        void* stream) {
  const size_t carried = state.size();
  std::vector<std::vector<TensorView>> results;
  std::vector<TensorView> preds;
  for (int j = 0; j < steps; ++j) {
    std::vector<TensorView> next = r.body(step, operands, stream);
    preds.push_back(next.back());
    next.pop_back();
    std::copy(next.begin(), next.end(), operands.begin());
    results.push_back(std::move(next));
  }
  // what the copies write is read first: a predicate or result that is a carried value (a body
  // that passes one on or swaps two) is staged, unless it is the copy's own destination
  auto written = [&](const TensorView& v) {
    return std::any_of(state.begin(), state.end(),
                       [&](const TensorView& d) { return overlap(v, d); });
  };
  u.steps.clear();
  for (TensorView p : preds) {
    if (written(p)) p = r.stage(p, stream);
    u.steps.push_back(static_cast<const bool*>(p.data));
  }
  std::vector<DeviceBackend::DeviceCopy> copies;
  for (size_t k = 0; k < carried; ++k) {
    if (!bytes_of(state[k])) continue;
    DeviceBackend::DeviceCopy c{state[k].data, nullptr, bytes_of(state[k]), {}};
    for (const auto& next : results) {
      TensorView v = next[k];
      if (v.data != state[k].data && written(v)) v = r.stage(v, stream);
      c.by_step.push_back(v.data);
    }
    copies.push_back(std::move(c));
  }
  u.first = false;
  r.b().set_condition(r.dev(), stream, h, u, copies);
}

// while_loop as a WHILE node: the condition evaluated once before it, then the body (and the
// condition on its results) per iteration, the results copied into the carried values.
void record_while(KernelContext& ctx, Recorder& r) {
  const auto& bodies = bodies_of(ctx).bodies;
  const size_t carried = static_cast<size_t>(ctx.num_outputs());
  std::vector<TensorView> state = r.carried_state(ctx);
  r.copy_all(inputs_from(ctx, 0, static_cast<int>(carried)), state, r.w.stream);
  std::vector<TensorView> operands = state;  // carried, then captured
  for (const TensorView& v : inputs_from(ctx, static_cast<int>(carried), ctx.num_inputs()))
    operands.push_back(v);
  Update u;
  u.value = r.body(bodies[0], operands, r.w.stream)[0].data;
  u.counter = static_cast<int64_t*>(r.buffer({}, i64).data);
  u.max_trips = ctx.attrs().i("max_trip_count", -1);
  u.errors = ctx.error_slot();
  if (ctx.error_info()) ctx.error_info()[0] = static_cast<int64_t>(ErrorKind::trip_count);
  const uint64_t h = r.b().create_condition(r.dev(), r.w.stream);
  r.b().set_condition(r.dev(), r.w.stream, h, u);
  const std::vector<void*> graphs = r.b().add_conditional(r.dev(), r.w.stream, h, true, 1);
  const bool one_run = bodies.size() == 3;  // the step: body and condition together
  if (const int steps = one_run ? steps_per_launch(bodies[2], true) : 1; steps > 1) {
    BodyStream s(r.b(), r.dev(), graphs[0]);
    record_while_steps(r, bodies[2], operands, state, steps, u, h, s.stream());
    s.end();
  } else {
    BodyStream s(r.b(), r.dev(), graphs[0]);
    std::vector<TensorView> next = r.body(bodies[one_run ? 2 : 1], operands, s.stream());
    TensorView pred;
    if (one_run) {
      pred = next.back();
      next.pop_back();
    }
    // the results into the carried values, in the kernel that sets the condition
    std::vector<DeviceBackend::DeviceCopy> copies = r.copies(next, state, s.stream());
    if (!one_run) {  // the condition reads the new carried values: copies first
      for (const auto& c : copies)
        r.b().copy_async(r.dev(), c.dst, false, c.src, false, c.bytes, s.stream());
      copies.clear();
      pred = r.body(bodies[0], operands, s.stream())[0];
    }
    bool written = false;  // (the copies must not write what the condition reads)
    for (const TensorView& v : state) written = written || overlap(pred, v);
    if (written && !copies.empty()) pred = r.stage(pred, s.stream());
    u.value = pred.data;
    u.first = false;
    r.b().set_condition(r.dev(), s.stream(), h, u, copies);
    s.end();
  }
  r.carried_out(ctx, state);
}

// A for_loop's body run of `steps` steps as a WHILE node (after the work recorded so far on the
// outer stream): step j reads loop index counter + j (the counter itself, then index[j - 1]), and
// the results of the last step go into the carried values with the condition's update.
void record_for_steps(Recorder& r, const CompiledBody& body, std::vector<TensorView> operands,
                      const std::vector<TensorView>& state, int steps, Update u,
                      const std::vector<TensorView>& index) {
  const uint64_t h = r.b().create_condition(r.dev(), r.w.stream);
  u.block = steps;
  u.index.clear();
  for (int j = 1; j < steps; ++j) u.index.push_back(static_cast<int64_t*>(index[j - 1].data));
  r.b().set_condition(r.dev(), r.w.stream, h, u);
  const std::vector<void*> graphs = r.b().add_conditional(r.dev(), r.w.stream, h, true, 1);
  BodyStream s(r.b(), r.dev(), graphs[0]);
  const TensorView counter = operands[0];
  std::vector<TensorView> next;
  for (int j = 0; j < steps; ++j) {
    operands[0] = j ? index[j - 1] : counter;
    next = r.body(body, operands, s.stream());
    std::copy(next.begin(), next.end(), operands.begin() + 1);
  }
  const auto copies = r.copies(next, state, s.stream());
  u.first = false;
  u.advance = steps;
  r.b().set_condition(r.dev(), s.stream(), h, u, copies);
  s.end();
}

// for_loop as WHILE nodes over a device counter against the trip count: body runs of several
// steps while a whole run fits in the count, then one step a run for the rest.
void record_for(KernelContext& ctx, Recorder& r) {
  const auto& body = bodies_of(ctx).bodies[0];
  const int carried = ctx.num_outputs();
  std::vector<TensorView> state = r.carried_state(ctx);
  r.copy_all(inputs_from(ctx, 1, 1 + carried), state, r.w.stream);
  Update u;
  u.kind = Update::count;
  u.value = ctx.in(0).data;
  u.count_type = ctx.in(0).dtype;
  const TensorView counter = r.buffer({}, i64);
  u.counter = static_cast<int64_t*>(counter.data);
  std::vector<TensorView> operands{counter};  // the counter, carried, captured
  for (const TensorView& v : state) operands.push_back(v);
  for (const TensorView& v : inputs_from(ctx, 1 + carried, ctx.num_inputs())) operands.push_back(v);
  const int steps = steps_per_launch(body, false);
  std::vector<TensorView> index;
  for (int j = 1; j < steps; ++j) index.push_back(r.buffer({}, i64));
  record_for_steps(r, body, operands, state, steps, u, index);
  if (steps > 1) {  // the rest, from where the counter stopped
    u.first = false;
    u.advance = 0;
    record_for_steps(r, body, operands, state, 1, u, {});
  }
  r.carried_out(ctx, state);
}

// Records the node when a run is being recorded on a device: returns false when it should run.
bool recorded(KernelContext& ctx, const Place& w, void (*record)(KernelContext&, Recorder&)) {
  Recording* rec = w.b ? recording_in_progress() : nullptr;
  if (!rec) return false;
  Recorder r{*rec, w};
  record(ctx, r);
  return true;
}

// ---- Run from the host ----

template <Backend B> void cond_kernel(KernelContext& ctx) {
  const Place w = place_of(ctx, B);
  if (recorded(ctx, w, record_cond)) return;
  const auto& bodies = bodies_of(ctx).bodies;
  const bool taken = read_bool(wrap(ctx.in(0), w), w);
  // the branch taken, as a span of the profiler (its body's run nested in it)
  prof::HostScope span(SpanKind::run, taken ? "cond: then_fn" : "cond: else_fn");
  const std::vector<Array> results = run_body(bodies[taken ? 0 : 1], inputs_of(ctx, w, 1), w);
  for (int k = 0; k < ctx.num_outputs(); ++k) copy_out(results[k], ctx.out(k), w);
}

template <Backend B> void while_loop_kernel(KernelContext& ctx) {
  const Place w = place_of(ctx, B);
  if (recorded(ctx, w, record_while)) return;
  const auto& bodies = bodies_of(ctx).bodies;
  const int64_t max_trips = ctx.attrs().i("max_trip_count", -1);
  std::vector<Array> values = inputs_of(ctx, w, 0);  // carried, then captured
  const size_t carried = static_cast<size_t>(ctx.num_outputs());
  // the condition once, then one run per iteration: the step (body and condition together)
  // where it was compiled, else the body and the condition
  const bool one_run = bodies.size() == 3;
  bool go = read_bool(run_body(bodies[0], values, w)[0], w);
  for (int64_t trips = 0; go; ++trips) {
    // each iteration a span of the profiler, numbered
    prof::HostScope span(SpanKind::run, "while_loop iteration",
                         prof::on() ? std::to_string(trips) : std::string());
    if (max_trips >= 0 && trips == max_trips)
      fail<ValueError>(
          "[while_loop] the condition still holds after max_trip_count = {} "
          "iterations",
          max_trips);
    std::vector<Array> next = run_body(bodies[one_run ? 2 : 1], values, w);
    for (size_t k = 0; k < carried; ++k) values[k] = std::move(next[k]);
    go = read_bool(one_run ? next[carried] : run_body(bodies[0], values, w)[0], w);
  }
  for (size_t k = 0; k < carried; ++k) copy_out(values[k], ctx.out(static_cast<int>(k)), w);
}

template <Backend B> void for_loop_kernel(KernelContext& ctx) {
  const Place w = place_of(ctx, B);
  if (recorded(ctx, w, record_for)) return;
  const auto& body = bodies_of(ctx).bodies[0];
  std::vector<Array> values = inputs_of(ctx, w, 0);  // the counter, carried, captured
  const int64_t n = read_int(values[0], w);
  const size_t carried = static_cast<size_t>(ctx.num_outputs());
  Array host_i = Array::empty({}, i64);
  values[0] = w.b ? device_array(*w.b, w.device, {}, i64, w.stream) : host_i;
  for (int64_t i = 0; i < n; ++i) {
    prof::HostScope span(SpanKind::run, "for_loop iteration",
                         prof::on() ? std::to_string(i) : std::string());
    // (each body run on a GPU ends with a wait, so host_i is not read while it changes)
    *host_i.data<int64_t>() = i;
    if (w.b)
      w.b->copy_async(w.device.index, values[0].data(), false, host_i.data(), true, sizeof(int64_t),
                      w.stream);
    std::vector<Array> next = run_body(body, values, w);
    for (size_t k = 0; k < carried; ++k) values[1 + k] = std::move(next[k]);
  }
  for (size_t k = 0; k < carried; ++k) copy_out(values[1 + k], ctx.out(static_cast<int>(k)), w);
}

}  // namespace

std::shared_ptr<const OpParams> compile_bodies(const Program& p, const Node& n,
                                               const ExecutableImpl& impl) {
  std::vector<TensorInfo> operands;
  for (size_t k = n.op == OpId::Cond ? 1 : 0; k < n.inputs.size(); ++k)
    operands.push_back(p.graph.info(n.inputs[k]));
  if (n.op == OpId::ForLoop) operands[0] = {{}, i64};
  auto out = std::make_shared<ControlBodies>();
  std::vector<std::shared_ptr<const Body>> bodies = n.bodies;
  if (n.op == OpId::WhileLoop)  // (bodies[2]: the body and the condition as one step)
    if (auto step = while_step_body(*n.bodies[0], *n.bodies[1], operands, n.outputs.size()))
      bodies.push_back(std::move(step));
  for (const auto& body : bodies) {
    Program bp = extract_program(body->graph, body->results);
    bp.num_returned = body->results.size();
    std::vector<std::pair<int32_t, Shape>> shapes;
    for (size_t k = 0; k < body->operands.size(); ++k)
      if (body->operands[k] >= 0) shapes.emplace_back(body->operands[k], operands[k].shape);
    CompiledBody c;
    c.exe = compile_program(std::move(bp), impl.device, impl.options, shapes);
    const auto& nodes = c.exe->program.graph.nodes;
    for (int32_t origin : body->operands) {
      int32_t feed = -1;
      for (int32_t ph : c.exe->placeholders)
        if (origin >= 0 && nodes[ph].origin == origin) feed = ph;
      c.feed_node.push_back(feed);
    }
    out->bodies.push_back(std::move(c));
  }
  return out;
}

std::string bodies_capture_blocker(const Node& n) {
  if (!n.params) return "its bodies are not compiled";
  for (const CompiledBody& body : params_as<ControlBodies>(*n.params).bodies)
    if (std::string why = capture_blocker(*body.exe); !why.empty())
      return fmt::format("a body: {}", why);
  return {};
}

void register_control_dispatch(Backend backend) {
  const bool cpu = backend == Backend::cpu;
  auto entry = [](KernelFn fn) {
    KernelEntry e;
    e.fn = fn;
    e.dtypes = kAllTypes;  // the bodies' kernels check theirs
    e.half_via_f32 = false;
    return e;
  };
  register_kernel(OpId::Cond, backend,
                  entry(cpu ? cond_kernel<Backend::cpu> : cond_kernel<Backend::cuda>));
  KernelEntry loop =
      entry(cpu ? while_loop_kernel<Backend::cpu> : while_loop_kernel<Backend::cuda>);
  loop.reports_errors = !cpu;  // max_trip_count, when recorded on the device
  register_kernel(OpId::WhileLoop, backend, loop);
  register_kernel(OpId::ForLoop, backend,
                  entry(cpu ? for_loop_kernel<Backend::cpu> : for_loop_kernel<Backend::cuda>));
}

}  // namespace kiln::detail
