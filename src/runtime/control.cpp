// cond, while_loop and for_loop at run time. Each body is an executable of its own, compiled with
// the outer executable for its device and options at the shapes of the node's inputs. The node's
// kernel runs on the host: it reads the predicate (or the trip count), runs the body's
// executable on the outer run's stream with the operands as feeds (no copy), and copies the last
// results into the node's outputs. On a GPU that is one wait for the stream per body run (and per
// predicate read): the loop is driven from the host.
#include "runtime/control.h"

#include <fmt/format.h>

#include <cstring>
#include <string>

#include "core/device_backend.h"
#include "core/errors.h"
#include "core/op_registry.h"
#include "ops/control_ops.h"
#include "runtime/device_run.h"
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

template <Backend B> void cond_kernel(KernelContext& ctx) {
  const Place w = place_of(ctx, B);
  const auto& bodies = bodies_of(ctx).bodies;
  const bool taken = read_bool(wrap(ctx.in(0), w), w);
  // the branch taken, as a span of the profiler (its body's run nested in it)
  prof::HostScope span(SpanKind::run, taken ? "cond: then_fn" : "cond: else_fn");
  const std::vector<Array> results = run_body(bodies[taken ? 0 : 1], inputs_of(ctx, w, 1), w);
  for (int k = 0; k < ctx.num_outputs(); ++k) copy_out(results[k], ctx.out(k), w);
}

template <Backend B> void while_loop_kernel(KernelContext& ctx) {
  const Place w = place_of(ctx, B);
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
  register_kernel(OpId::WhileLoop, backend,
                  entry(cpu ? while_loop_kernel<Backend::cpu> : while_loop_kernel<Backend::cuda>));
  register_kernel(OpId::ForLoop, backend,
                  entry(cpu ? for_loop_kernel<Backend::cpu> : for_loop_kernel<Backend::cuda>));
}

}  // namespace kiln::detail
