// The executors behind Executable::run and run_async: the CPU executor (cpu_executor.cpp), the
// device executor (device_executor.cpp, recorded runs in recording.cpp) and queue submission.
#pragma once

#include <functional>
#include <future>
#include <memory>
#include <vector>

#include "runtime/executable_impl.h"

namespace kiln {

/// What is left of a device run once its work is on a stream: called after the stream has passed
/// it, it checks the error slots, fills the returned aliases, gives the slot back and returns the
/// outputs (or throws the run's error).
using Finish = std::function<std::vector<Array>()>;

/// Runs `x` on the CPU with the feeds by program node id (nullptr: not fed).
std::vector<Array> run_cpu(detail::ExecutableImpl& x, const std::vector<const Array*>& feed_by_node);
/// Runs `x` on its device: on `on_stream` (a queue's) or a stream of its own. Without `deferred`
/// it waits for the run and returns the outputs; with it (debugging modes aside) it returns
/// device arrays still being written and leaves the rest to *deferred.
std::vector<Array> run_device(detail::ExecutableImpl& x,
                              const std::vector<const Array*>& feed_by_node,
                              void* on_stream = nullptr, Finish* deferred = nullptr);

/// Submits a run of `impl` with the feeds by program node id to `queue`: the run waits for the
/// descriptor's events on the queue, then runs; the future gets its outputs (run_async.cpp).
std::future<std::vector<Array>> submit_async(const std::shared_ptr<detail::ExecutableImpl>& impl,
                                             Queue& queue,
                                             const std::vector<const Array*>& by_node,
                                             ExecutionDescriptor desc);

/// The returned values that have buffers of their own (the plan's output slots), each made by
/// `make(shape, dtype)`; the others stay empty until fill_aliases.
template <typename Make>
std::vector<Array> allocate_outputs(const detail::ExecutableImpl& x, Make&& make) {
  using Where = ValueSlot::Where;
  const auto& nodes = x.program.graph.nodes;
  std::vector<Array> outputs(x.program.num_returned);
  for (size_t k = 0; k < x.program.num_returned; ++k) {
    const detail::ValueRef v = x.program.outputs[k];
    const ValueSlot& s = x.plan.slots[v.node][v.index];
    if (s.where == Where::output && s.index == static_cast<int>(k)) {
      const TensorInfo& t = nodes[v.node].outputs[v.index];
      outputs[k] = make(t.shape, t.dtype);
    }
  }
  return outputs;
}

/// The returned values no step wrote: feeds (`feed(placeholder)`), constants (copied) and values
/// returned more than once.
template <typename Feed>
void fill_aliases(const detail::ExecutableImpl& x, std::vector<Array>& outputs, Feed&& feed) {
  using Where = ValueSlot::Where;
  for (size_t k = 0; k < x.program.num_returned; ++k) {
    if (outputs[k].valid() && outputs[k].storage()) continue;
    detail::ValueRef v = x.program.outputs[k];
    const ValueSlot& s = x.plan.slots[v.node][v.index];
    if (s.where == Where::output) outputs[k] = outputs[s.index];
    else if (s.where == Where::feed) outputs[k] = feed(s.index);
    else if (s.where == Where::constant) outputs[k] = x.program.graph.nodes[s.index].value.copy();
  }
}

}  // namespace kiln
