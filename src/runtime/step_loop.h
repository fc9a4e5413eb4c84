// The step loop of every run (CPU, device, recorded) and the observers it calls around each
// step: validation against the CPU, step timing and the profiler.
#pragma once

#include <memory>
#include <vector>

#include "core/errors.h"
#include "runtime/executable_impl.h"

namespace kiln {

namespace prof {
class RunProfile;
}

/// One step as observers see it: its index in ExecutableImpl::steps, its node, and its views.
struct StepCall {
  size_t index;
  const Step& step;
  const detail::Node& node;
  const std::vector<TensorView>& in;
  const std::vector<TensorView>& out;
};

/// Watches the steps of one run (debugging and profiling; a normal run has none).
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void before_step(const StepCall& call) {}
  virtual void after_step(const StepCall& call) {}
  /// After the last step has been run or enqueued.
  virtual void after_steps() {}
};
/// Called in order before a step, in reverse order after it.
using StepObservers = std::vector<std::unique_ptr<StepObserver>>;

/// Where value `v` of `x` lives: feeds at `feed_data(placeholder)`, intermediates in `arena`,
/// returned values in `outputs`.
template <typename FeedData> void* value_data(const detail::ExecutableImpl& x, detail::ValueRef v,
                                              FeedData&& feed_data, char* arena,
                                              const std::vector<Array>& outputs) {
  using Where = ValueSlot::Where;
  const ValueSlot& s = x.plan.slots[v.node][v.index];
  switch (s.where) {
    case Where::feed:
      return const_cast<void*>(feed_data(s.index));
    case Where::constant:
      return const_cast<void*>(x.program.graph.nodes[s.index].value.data());
    case Where::arena:
      return arena + s.offset;
    case Where::output:
      return const_cast<void*>(outputs[s.index].data());
    case Where::none:
      break;
  }
  KILN_ASSERT(false);
  return nullptr;
}
/// The view of value `v` (value_data and the value's shape and dtype).
template <typename FeedData> TensorView value_view(const detail::ExecutableImpl& x,
                                                   detail::ValueRef v, FeedData&& feed_data,
                                                   char* arena, const std::vector<Array>& outputs) {
  const TensorInfo& t = x.program.graph.nodes[v.node].outputs[v.index];
  return {value_data(x, v, feed_data, arena, outputs), t.shape, t.dtype};
}

/// Runs every step of `x` in order: `run(k, step, node, in, out)` on the views of the values at
/// `data(ValueRef)` (lent: `run` gives them back unchanged), between the observers' hooks.
template <typename Data, typename Run> void run_steps(const detail::ExecutableImpl& x, Data&& data,
                                                      Run&& run, const StepObservers& observers) {
  const auto& nodes = x.program.graph.nodes;
  const ThreadPool::Bound threads(x.own_pool.get());  // (CompileOptions::num_threads)
  // (views filled in place: a step reuses the vectors and shapes of the step before)
  std::vector<TensorView> in, out;
  auto fill = [&](TensorView& dst, detail::ValueRef v) {
    const TensorInfo& t = nodes[v.node].outputs[v.index];
    dst.data = data(v);
    dst.shape.assign(t.shape.begin(), t.shape.end());
    dst.dtype = t.dtype;
  };
  for (size_t k = 0; k < x.steps.size(); ++k) {
    const Step& st = x.steps[k];
    const detail::Node& n = nodes[st.node];
    in.resize(n.inputs.size());
    out.resize(n.outputs.size());
    for (size_t i = 0; i < n.inputs.size(); ++i) fill(in[i], n.inputs[i]);
    for (size_t o = 0; o < n.outputs.size(); ++o) fill(out[o], {st.node, static_cast<int32_t>(o)});
    if (observers.empty()) {
      run(k, st, n, in, out);
      continue;
    }
    const StepCall call{k, st, n, in, out};
    for (auto& o : observers) o->before_step(call);
    run(k, st, n, in, out);
    for (auto o = observers.rbegin(); o != observers.rend(); ++o) (*o)->after_step(call);
  }
  for (auto o = observers.rbegin(); o != observers.rend(); ++o) (*o)->after_steps();
}

// The observers (each where its job lives).

/// The profiler's spans of every step (profiler_run.cpp). `device_run`: steps on the CPU are
/// fallbacks.
std::unique_ptr<StepObserver> profile_steps(prof::RunProfile& run, bool device_run);
/// KILN_STEP_TIMES: wall time per step into x.step_ms (step_times.cpp); with a backend, the host
/// waits for `stream` before and after every step.
std::unique_ptr<StepObserver> time_steps_on_host(detail::ExecutableImpl& x, DeviceBackend* b,
                                                 void* stream);
/// KILN_STEP_TIMES=device: a timing event on `stream` before every step and after the last; the
/// host waits for them after the last step (step_times.cpp).
std::unique_ptr<StepObserver> time_steps_on_device(detail::ExecutableImpl& x, DeviceBackend& b,
                                                   void* stream);
/// Prints the times x.step_ms gathered (when the executable is destroyed).
void print_step_times(const detail::ExecutableImpl& x);
/// KILN_VALIDATE=cpu: every device step also runs on the CPU from the same inputs and the
/// outputs are compared; throws DeviceError at the first disagreement (validate.cpp).
std::unique_ptr<StepObserver> validate_on_cpu(const detail::ExecutableImpl& x, DeviceBackend& b,
                                              void* stream);

}  // namespace kiln
