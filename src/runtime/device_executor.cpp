// The device executor: a run enqueued on a device stream with a (stream, arena) slot of its own,
// replayed from a recording when it can be (recording.cpp), step by step otherwise, with the step
// observers of the debugging modes and the profiler.
#include <fmt/format.h>

#include "core/op_registry.h"
#include "ops/core_params.h"
#include "runtime/device_run.h"
#include "runtime/env.h"
#include "runtime/profiler_run.h"
#include "runtime/run_kernel.h"
#include "runtime/step_loop.h"

namespace kiln {

using detail::ExecutableImpl;
using detail::Node;
using detail::ValueRef;

SlotLease::~SlotLease() {
  if (!slot.stream) return;
  if (ok) {
    ++slot.runs;
  } else if (stream) {
    try {
      x.backend->synchronize(x.device.index, stream);
    } catch (...) {
    }
  }
  std::lock_guard<std::mutex> l(x.arena_mu);
  x.free_slots.push_back(std::move(slot));
}

Array device_array(DeviceBackend& b, Device device, const Shape& shape, DType t, void* stream) {
  auto st = std::make_shared<Storage>();
  st->bytes = static_cast<size_t>(numel(shape)) * size_of(t);
  const int dev = device.index;
  st->data = b.allocate(dev, st->bytes, stream);
  st->device = device;
  st->deleter = [&b, dev](void* p) { b.release(dev, p); };
  return Array::adopt(std::move(st), shape, t);
}

void check_error_slots(const ExecutableImpl& x, const ExecutableImpl::DeviceSlot& slot) {
  for (size_t k = 0; k < x.steps.size(); ++k) {
    const auto packed = static_cast<uint64_t>(slot.errors_host[2 * k]);
    if (packed == ~uint64_t{0}) continue;
    const int64_t pos = static_cast<int64_t>(packed >> 32);
    const auto low = static_cast<uint32_t>(packed);
    const int64_t value =
        low == 0x80000000u ? slot.errors_host[2 * k + 1] : static_cast<int32_t>(low);
    const int64_t* info = slot.error_info.data() + 3 * k;
    const Node& n = x.program.graph.nodes[x.steps[k].node];
    std::string shapes;
    for (auto v : n.inputs) shapes += (shapes.empty() ? "" : ", ") + str(x.program.graph.info(v).shape);
    const std::string where = fmt::format("(position {} of node %{} with inputs {}; found on {})",
                                          pos, x.steps[k].node, shapes, x.device.str());
    switch (static_cast<ErrorKind>(info[0])) {
      case ErrorKind::label:
        fail<ValueError>("[{}] label {} at position {} is out of range for {} classes {}",
                         op_name(n.op), value, pos, info[2], where);
      case ErrorKind::plane_index:
        fail<ValueError>("[{}] index {} out of range for an input plane of {} elements {}",
                         op_name(n.op), value, info[2], where);
      case ErrorKind::index_tuple: {
        const int64_t axis = info[1] + pos % std::max<int64_t>(info[2], 1);
        const Shape& xs = x.program.graph.info(n.inputs[0]).shape;
        fail<ValueError>("[{}] index {} out of range for axis {} of size {} {}", op_name(n.op),
                         value, axis, axis < static_cast<int64_t>(xs.size()) ? xs[axis] : -1,
                         where);
      }
      case ErrorKind::sequence_length:
        fail<ValueError>("[{}] seq_lens[{}] = {} is outside [0, {}] {}", op_name(n.op), pos, value,
                         info[2], where);
      case ErrorKind::slice_start:
        fail<ValueError>("{} {}",
                         assign_slice_range_error(
                             n.attrs.str("variable", ""), x.program.graph.info(n.inputs[0]).shape,
                             x.program.graph.info(n.inputs[1]).shape, pos, value),
                         where);
      case ErrorKind::trip_count:
        fail<ValueError>("[{}] the condition still holds after max_trip_count = {} iterations {}",
                         op_name(n.op), value, where);
      case ErrorKind::index_on_axis:
        break;
    }
    fail<ValueError>("[{}] index {} out of range for axis {} of size {} {}", op_name(n.op), value,
                     info[1], info[2], where);
  }
}

void check_body_error_slots(const ExecutableImpl::Recording& rec) {
  for (const auto& [body, slot] : rec.body_errors) check_error_slots(*body, slot);
}

std::vector<Array> run_device(ExecutableImpl& x, const std::vector<const Array*>& feed_by_node,
                              void* on_stream, Finish* deferred) {
  const auto& nodes = x.program.graph.nodes;
  for (int32_t ph : x.placeholders)
    if (!feed_by_node[ph]) fail<ValueError>("[run] placeholder '{}' has no feed", nodes[ph].name);
  DeviceBackend& b = *x.backend;
  const int dev = x.device.index;

  // a (stream, arena) pair of its own; back to the pool however the run ends
  auto lease = std::make_shared<SlotLease>(x);
  auto& slot = lease->slot;
  bool may_record = false;
  {
    std::lock_guard<std::mutex> l(x.arena_mu);
    if (!x.capture_off) x.capture_off = capture_blocker(x);
    may_record = x.capture_off->empty();
    if (!x.free_slots.empty()) {
      slot = std::move(x.free_slots.back());
      x.free_slots.pop_back();
    }
  }
  if (!slot.stream) slot.stream = b.create_stream(dev);
  // the run's work goes on the caller's queue, or on the slot's own stream
  void* stream = lease->stream = on_stream ? on_stream : slot.stream;
  auto device_array = [&](const Shape& shape, DType t) {
    return kiln::device_array(b, x.device, shape, t, stream);
  };
  if (!slot.arena && x.plan.arena_bytes)
    slot.arena = device_array({static_cast<int64_t>(x.plan.arena_bytes)}, u8).storage();
  char* base = slot.arena ? static_cast<char*>(slot.arena->data) : nullptr;
  const size_t error_bytes = 2 * sizeof(int64_t) * x.steps.size();
  if (x.reports_errors) {
    if (!slot.errors) {
      slot.errors = device_array({static_cast<int64_t>(2 * x.steps.size())}, i64).storage();
      slot.errors_host = static_cast<int64_t*>(b.allocate_mapped(error_bytes));
      slot.error_info.assign(3 * x.steps.size(), 0);
    }
  }
  // variables follow the executables that use them
  for (int32_t v : x.variables)
    if (auto& st = nodes[v].value.storage()) move_storage(*st, x.device);
  // debugging modes wait for steps on the host: they finish the run now
  const bool validate = env::validate_on_cpu();
  const bool on_device = env::step_times_device();
  const bool timed = env::step_times() && !on_device;
  if (validate || env::step_times()) deferred = nullptr;
  // null when the profiler is off; a profiled run is not replayed, so that every op is timed
  const auto prof = prof::RunProfile::begin(x.device, &b, stream);
  // from the second run on a slot: one launch of the slot's recording, unless copying this run's
  // device feeds in and its outputs out would cost more than the launches it saves
  if (may_record && !prof && slot.runs > 0 && recording_pays(x, feed_by_node)) {
    std::vector<Array> outputs;
    if (run_recorded(lease, feed_by_node, outputs, deferred)) return outputs;
  }
  if (x.reports_errors)  // all ones: no report
    b.memset_async(dev, slot.errors->data, 0xff, error_bytes, stream);

  // feeds from the host go up on the run's stream
  std::vector<Array> feeds(nodes.size());
  for (int32_t ph : x.placeholders) {
    const Array& a = *feed_by_node[ph];
    if (a.device() == x.device) {
      feeds[ph] = a;
      continue;
    }
    feeds[ph] = device_array(a.shape(), a.dtype());
    const int mark = prof ? prof->mark() : -1;
    b.copy_async(dev, feeds[ph].data(), false, a.data(), true, a.nbytes(), stream);
    if (prof) prof->copy(mark, "H2D", a.nbytes());
  }

  std::vector<Array> outputs = allocate_outputs(x, device_array);
  auto feed_data = [&](int32_t ph) { return feeds[ph].data(); };
  auto data = [&](ValueRef v) { return value_data(x, v, feed_data, base, outputs); };
  KernelEnv kenv = step_kernel_env(x, b, dev, stream);
  auto run = [&](size_t k, const Step& st, const Node& n, std::vector<TensorView>& in,
                 std::vector<TensorView>& out) {
    set_error_slot(x, slot, k, kenv);
    if (st.backend == Backend::cpu)
      run_on_host(*st.kernel, n, in, out, b, dev, stream, x.pool, nullptr, prof.get());
    else
      run_device_kernel(*st.kernel, st.backend, n, in, out, x.pool, kenv);
  };
  // none in a normal run: one test per step. Before a step in this order, after it in reverse.
  StepObservers observers;
  // KILN_STEP_TIMES=device: runs after the first on a slot (no algorithm measurements)
  if (on_device && slot.runs > 0) observers.push_back(time_steps_on_device(x, b, stream));
  if (prof) observers.push_back(profile_steps(*prof, true));
  if (validate) observers.push_back(validate_on_cpu(x, b, stream));
  if (timed) observers.push_back(time_steps_on_host(x, &b, stream));
  run_steps(x, data, run, observers);
  if (prof) prof->encoded();
  auto result = end_run(std::move(lease), std::move(outputs),
                        [feeds = std::move(feeds)](int32_t ph) { return feeds[ph]; }, deferred);
  // a profile's device spans are read once the stream has passed the run
  if (prof && deferred)
    *deferred = [prof, finish = std::move(*deferred)]() mutable {
      prof->finish();
      return finish();
    };
  else if (prof)
    prof->finish();
  return result;
}

}  // namespace kiln
