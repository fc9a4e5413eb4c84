// KILN_VALIDATE=cpu: a step observer that runs every device step on the CPU too, from the same
// inputs, and stops the run at the first output that disagrees.
#include <cmath>

#include "core/device_backend.h"
#include "core/op_registry.h"
#include "runtime/run_kernel.h"
#include "runtime/step_loop.h"

namespace kiln {

namespace {
// The first element where `got` (from the device) and `want` (from the CPU) differ beyond the
// tolerance of their dtype, or -1.
int64_t first_mismatch(const Array& got, const Array& want, double* g, double* w) {
  const auto a = got.to_vector<double>(), b = want.to_vector<double>();
  double tol = 0;
  switch (got.dtype()) {
    case f64: tol = 1e-9; break;
    case f32: tol = 1e-4; break;
    case f16: tol = 1e-2; break;
    case bf16: tol = 5e-2; break;
    default: break;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (a[i] == b[i]) continue;
    if (std::abs(a[i] - b[i]) <= tol * (1 + std::abs(b[i]))) continue;
    *g = a[i];
    *w = b[i];
    return static_cast<int64_t>(i);
  }
  return -1;
}

class ValidateOnCpu final : public StepObserver {
 public:
  ValidateOnCpu(const detail::ExecutableImpl& x, DeviceBackend& b, void* stream)
      : x_(x), b_(b), stream_(stream) {}
  // the CPU's outputs from the step's inputs, read before the device kernel (which may write
  // over them)
  void before_step(const StepCall& call) override {
    cpu_ = nullptr;
    const OpId op = call.node.op;
    // fallbacks already run on the CPU; collectives talk to other ranks: not run twice; a
    // control node's bodies are runs of their own, validated step by step as they run
    if (call.step.backend == Backend::cpu || op == OpId::AllReduce || op == OpId::CollectiveWait ||
        !call.node.bodies.empty())
      return;
    cpu_ = find_kernel(op, Backend::cpu, layout_of(op, call.node.attrs));
    if (cpu_)
      run_on_host(*cpu_, call.node, call.in, call.out, b_, x_.device.index, stream_, x_.pool,
                  &want_);
  }
  void after_step(const StepCall& call) override {
    if (!cpu_) return;
    const auto& out = call.out;
    for (size_t o = 0; o < out.size(); ++o) {
      Array got = Array::empty(out[o].shape, out[o].dtype);
      b_.copy_async(x_.device.index, got.data(), true, out[o].data, false, got.nbytes(), stream_);
      double g = 0, w = 0;
      const int64_t i = first_mismatch(got, want_[o], &g, &w);
      if (i >= 0)
        fail<DeviceError>("[validate] node %{} ({}) output {} {} {} disagrees with the cpu at "
                          "element {}: {} on {}, {} on the cpu",
                          call.step.node, op_name(call.node.op), o, name(out[o].dtype),
                          str(out[o].shape), i, g, x_.device.str(), w);
    }
  }

 private:
  const detail::ExecutableImpl& x_;
  DeviceBackend& b_;
  void* stream_;
  const KernelEntry* cpu_ = nullptr;  // this step's CPU kernel, when validated
  std::vector<Array> want_;
};
}  // namespace

std::unique_ptr<StepObserver> validate_on_cpu(const detail::ExecutableImpl& x, DeviceBackend& b,
                                              void* stream) {
  return std::make_unique<ValidateOnCpu>(x, b, stream);
}

}  // namespace kiln
