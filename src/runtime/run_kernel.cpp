// Kernel calls: a kernel on host views or on a device's stream (f16/bf16 through f32 when it
// asks), a CPU kernel inside a device run, and one node evaluated on the CPU (constant folding).
#include "runtime/run_kernel.h"

#include "core/device_backend.h"
#include "core/errors.h"
#include "core/op_registry.h"
#include "runtime/kernel_views.h"
#include "runtime/profiler_run.h"

namespace kiln {

using detail::Node;

DType kernel_dtype(const KernelEntry& entry, const Node& node, const std::vector<TensorInfo>& in) {
  if (entry.dtype_input >= 0 && entry.dtype_input < static_cast<int>(in.size()))
    return in[entry.dtype_input].dtype;
  return node.outputs.empty() ? f32 : node.outputs[0].dtype;
}

namespace {
// Whether every output is empty (nothing to run).
bool all_empty(const std::vector<TensorView>& out) {
  bool empty = !out.empty();
  for (auto& o : out) empty = empty && o.numel() == 0;
  return empty;
}

// Whether `entry` runs f16/bf16 views through f32 copies (kernel_dtype, without building infos
// on the hot path).
bool runs_via_f32(const KernelEntry& entry, const Node& node, const std::vector<TensorView>& in) {
  const DType t = entry.dtype_input >= 0 && entry.dtype_input < static_cast<int>(in.size())
                      ? in[entry.dtype_input].dtype
                      : (node.outputs.empty() ? f32 : node.outputs[0].dtype);
  return entry.half_via_f32 && (t == f16 || t == bf16) && !entry.half_native.has(t);
}

// A device kernel of f32 run for f16/bf16 values: the device's cast kernel widens the half inputs
// into scratch memory and narrows the outputs back, all on the kernel's stream.
void run_device_kernel_via_f32(const KernelEntry& entry, Backend backend, const Node& node,
                               const std::vector<TensorView>& in,
                               const std::vector<TensorView>& out, ThreadPool* pool,
                               const KernelEnv& env) {
  const KernelEntry* cast = find_kernel(OpId::Cast, backend);
  KILN_ASSERT(cast && env.allocate && env.release);
  const Attrs none;
  std::vector<void*> temps;
  auto run_cast = [&](const TensorView& from, const TensorView& to) {
    KernelContext c(OpId::Cast, none, {from}, {to}, pool, &env);
    cast->fn(c);
  };
  auto widen = [&](const TensorView& v, bool copy_in) {
    if (v.dtype != f16 && v.dtype != bf16) return v;
    if (v.numel() == 0) return TensorView{v.data, v.shape, f32};  // nothing to convert
    void* p = env.allocate(env.user, env.device, static_cast<size_t>(v.numel()) * sizeof(float),
                           env.stream);
    temps.push_back(p);
    TensorView w{p, v.shape, f32};
    if (copy_in) run_cast(v, w);
    return w;
  };
  struct Release {
    const KernelEnv& env;
    std::vector<void*>& temps;
    ~Release() {
      for (void* p : temps) env.release(env.user, env.device, p);  // stream-ordered: after the kernel
    }
  } release{env, temps};
  std::vector<TensorView> in32, out32;
  for (auto& v : in) in32.push_back(widen(v, true));
  for (auto& v : out) out32.push_back(widen(v, false));
  KernelContext ctx(node.op, node.attrs, in32, out32, pool, &env, node.params.get());
  entry.fn(ctx);
  for (size_t i = 0; i < out.size(); ++i)
    if (out[i].dtype != out32[i].dtype) run_cast(out32[i], out[i]);
}
}  // namespace

void run_kernel(const KernelEntry& entry, const Node& node, std::vector<TensorView>& in,
                std::vector<TensorView>& out, ThreadPool* pool) {
  if (all_empty(out)) return;
  if (!runs_via_f32(entry, node, in)) {
    KernelContextViews lent(node.op, node.attrs, in, out, pool, nullptr, node.params.get());
    entry.fn(lent.ctx);
    return;
  }
  // f16/bf16 through f32; the conversions are split over the pool like any kernel
  auto convert_all = [&](const void* src, DType st, void* dst, DType dt, int64_t n) {
    auto run = [&](int64_t b, int64_t e) {
      convert(static_cast<const char*>(src) + b * size_of(st), st,
              static_cast<char*>(dst) + b * size_of(dt), dt, e - b);
    };
    if (pool) pool->parallel_for(n, 32768, run);
    else run(0, n);
  };
  std::vector<Array> temps;
  auto widen = [&](const TensorView& v, bool copy_in) {
    if (v.dtype != f16 && v.dtype != bf16) return v;
    Array a = Array::empty(v.shape, f32);
    if (copy_in) convert_all(v.data, v.dtype, a.data(), f32, v.numel());
    temps.push_back(a);
    return TensorView{a.data(), v.shape, f32};
  };
  std::vector<TensorView> in32, out32;
  for (auto& v : in) in32.push_back(widen(v, true));
  for (auto& v : out) out32.push_back(widen(v, false));
  KernelContext ctx(node.op, node.attrs, in32, out32, pool, nullptr, node.params.get());
  entry.fn(ctx);
  for (size_t i = 0; i < out.size(); ++i)
    if (out[i].dtype != out32[i].dtype)
      convert_all(out32[i].data, f32, out[i].data, out[i].dtype, out[i].numel());
}

void run_device_kernel(const KernelEntry& entry, Backend backend, const Node& node,
                       std::vector<TensorView>& in, std::vector<TensorView>& out, ThreadPool* pool,
                       const KernelEnv& env) {
  if (all_empty(out)) return;
  if (!runs_via_f32(entry, node, in)) {
    KernelContextViews lent(node.op, node.attrs, in, out, pool, &env, node.params.get());
    entry.fn(lent.ctx);
    return;
  }
  run_device_kernel_via_f32(entry, backend, node, in, out, pool, env);
}

void run_on_host(const KernelEntry& k, const Node& n, const std::vector<TensorView>& in,
                 const std::vector<TensorView>& out, DeviceBackend& b, int dev, void* stream,
                 ThreadPool* pool, std::vector<Array>* host_outputs, prof::RunProfile* prof) {
  std::vector<Array> hin, hout;
  std::vector<TensorView> vin, vout;
  for (auto& v : in) {
    hin.push_back(Array::empty(v.shape, v.dtype));
    const int mark = prof ? prof->mark() : -1;
    b.copy_async(dev, hin.back().data(), true, v.data, false, hin.back().nbytes(), stream);
    if (prof) prof->copy(mark, "D2H", hin.back().nbytes());
    vin.push_back({hin.back().data(), v.shape, v.dtype});
  }
  for (auto& v : out) {
    hout.push_back(Array::empty(v.shape, v.dtype));
    vout.push_back({hout.back().data(), v.shape, v.dtype});
  }
  run_kernel(k, n, vin, vout, pool);
  if (host_outputs) {
    *host_outputs = std::move(hout);
    return;
  }
  for (size_t i = 0; i < out.size(); ++i) {
    const int mark = prof ? prof->mark() : -1;
    b.copy_async(dev, out[i].data, false, hout[i].data(), true, hout[i].nbytes(), stream);
    if (prof) prof->copy(mark, "H2D", hout[i].nbytes());
  }
}

std::vector<Array> evaluate_node_cpu(const Node& node, const std::vector<Array>& inputs) {
  const KernelEntry* k = find_kernel(node.op, Backend::cpu, layout_of(node.op, node.attrs));
  if (!k) fail<UnsupportedError>("[{}] no cpu kernel to evaluate constants", op_name(node.op));
  std::vector<TensorView> in, out;
  for (auto& a : inputs) in.push_back({const_cast<void*>(a.data()), a.shape(), a.dtype()});
  std::vector<Array> outs;
  for (auto& o : node.outputs) {
    outs.push_back(Array::empty(o.shape, o.dtype));
    out.push_back({outs.back().data(), o.shape, o.dtype});
  }
  run_kernel(*k, node, in, out, &ThreadPool::global());
  return outs;
}

}  // namespace kiln
