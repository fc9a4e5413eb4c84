// The CPU executor: runs an executable's steps on the host, in an arena of its own for the run,
// with the step observers of the debugging modes and the profiler.
#include "core/device_backend.h"
#include "runtime/env.h"
#include "runtime/executor.h"
#include "runtime/profiler_run.h"
#include "runtime/run_kernel.h"
#include "runtime/step_loop.h"

namespace kiln {

using detail::ArenaPool;
using detail::ExecutableImpl;
using detail::Node;
using detail::ValueRef;

std::vector<Array> run_cpu(ExecutableImpl& x, const std::vector<const Array*>& feed_by_node) {
  const auto& nodes = x.program.graph.nodes;
  for (int32_t v : x.variables)
    if (auto& st = nodes[v].value.storage()) move_storage(*st, x.device);
  for (int32_t ph : x.placeholders)
    if (!feed_by_node[ph]) fail<ValueError>("[run] placeholder '{}' has no feed", nodes[ph].name);

  std::vector<Array> outputs =
      allocate_outputs(x, [](const Shape& s, DType t) { return Array::empty(s, t); });
  const ArenaPool::Lease arena(*x.arenas, x.plan.arena_bytes);
  char* base = arena.arena ? static_cast<char*>(arena.arena->data) : nullptr;

  auto feed_data = [&](int32_t ph) { return feed_by_node[ph]->data(); };
  auto data = [&](ValueRef v) { return value_data(x, v, feed_data, base, outputs); };
  auto run = [&](size_t, const Step& st, const Node& n, std::vector<TensorView>& in,
                 std::vector<TensorView>& out) { run_kernel(*st.kernel, n, in, out, x.pool); };
  // none in a normal run: one test per step
  StepObservers observers;
  const auto prof = prof::RunProfile::begin(x.device, nullptr, nullptr);  // null: profiler off
  if (prof) observers.push_back(profile_steps(*prof, false));
  if (env::step_times()) observers.push_back(time_steps_on_host(x, nullptr, nullptr));
  run_steps(x, data, run, observers);
  if (prof) prof->finish();

  // outputs that are feeds, constants or repeated targets
  fill_aliases(x, outputs, [&](int32_t ph) { return *feed_by_node[ph]; });
  return outputs;
}

}  // namespace kiln
