// What the device executor (device_executor.cpp) and the recorder of runs as graphs
// (recording.cpp) share: a run's slot lease, device arrays, error slots and the end of a run.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/device_backend.h"
#include "runtime/env.h"
#include "runtime/executor.h"

namespace kiln {

/// A slot taken from the executable's pool for one run, given back when the run has ended: after
/// waiting for the run's stream when it failed (work may still be in flight).
struct SlotLease {
  detail::ExecutableImpl& x;
  detail::ExecutableImpl::DeviceSlot slot;
  void* stream = nullptr;  // the run's
  bool ok = false;
  explicit SlotLease(detail::ExecutableImpl& e) : x(e) {}
  SlotLease(const SlotLease&) = delete;
  SlotLease& operator=(const SlotLease&) = delete;
  ~SlotLease();
};

/// An uninitialized array on `device`, allocated for work on `stream`.
Array device_array(DeviceBackend& b, Device device, const Shape& shape, DType t, void* stream);

/// What the kernels of `x` get on `stream` of device `dev` (makes `dev` current).
inline KernelEnv step_kernel_env(const detail::ExecutableImpl& x, DeviceBackend& b, int dev,
                                 void* stream) {
  KernelEnv kenv = b.kernel_env(dev, stream);
  kenv.deterministic = x.options.deterministic || env::deterministic();
  kenv.choices = x.options.kernels;
  kenv.many_shapes = x.many_shapes;
  return kenv;
}

/// Points `kenv` at step `k`'s error slot (or at none when its kernel reports nothing).
inline void set_error_slot(const detail::ExecutableImpl& x, detail::ExecutableImpl::DeviceSlot& slot,
                           size_t k, KernelEnv& kenv) {
  if (x.reports_errors && x.steps[k].kernel->reports_errors) {
    kenv.errors = static_cast<int64_t*>(slot.errors->data) + 2 * k;
    kenv.error_info = slot.error_info.data() + 3 * k;
  } else {
    kenv.errors = kenv.error_info = nullptr;
  }
}

/// Inputs the CPU would have rejected (indices out of range), reported by device kernels: throws
/// a ValueError like the CPU kernel's for the first bad position of the first step that reported.
void check_error_slots(const detail::ExecutableImpl& x,
                       const detail::ExecutableImpl::DeviceSlot& slot);

/// The error slots of the control ops' bodies a replay of `rec` ran (copied to the host): throws
/// like check_error_slots for the first that reported.
void check_body_error_slots(const detail::ExecutableImpl::Recording& rec);

/// The end of a run whose work is on the lease's stream: the error slots come back to the host,
/// then (once the stream has passed the run) they are checked (with those of the bodies of
/// `replayed`, the recording the run replayed, when given), the returned aliases filled (`alias`
/// gives a placeholder's value) and the slot given back. Without `deferred` this waits for the
/// stream and returns the outputs; with it, it returns nothing and leaves that to *deferred.
template <typename Alias>
std::vector<Array> end_run(std::shared_ptr<SlotLease> lease, std::vector<Array> outputs,
                           Alias alias, Finish* deferred,
                           const detail::ExecutableImpl::Recording* replayed = nullptr) {
  detail::ExecutableImpl& x = lease->x;
  auto& slot = lease->slot;
  DeviceBackend& b = *x.backend;
  const int dev = x.device.index;
  const size_t error_bytes = 2 * sizeof(int64_t) * x.steps.size();
  if (x.reports_errors)
    b.copy_to_pinned_async(dev, slot.errors_host, slot.errors->data, error_bytes, lease->stream);
  Finish finish = [lease, outputs = std::move(outputs), alias = std::move(alias),
                   replayed]() mutable {
    if (lease->x.reports_errors) check_error_slots(lease->x, lease->slot);
    if (replayed) check_body_error_slots(*replayed);
    lease->ok = true;
    fill_aliases(lease->x, outputs, alias);
    return std::move(outputs);
  };
  if (deferred) {
    *deferred = std::move(finish);
    return {};
  }
  b.synchronize(dev, lease->stream);
  return finish();
}

// Recorded runs (recording.cpp).

/// Why the runs of `x` are not recorded as graphs; empty when they are.
std::string capture_blocker(const detail::ExecutableImpl& x);
/// Whether replaying a recording pays for copying this run's device feeds in and outputs out.
bool recording_pays(const detail::ExecutableImpl& x, const std::vector<const Array*>& feed_by_node);
/// A run replayed from the slot's recording (made now when there is none, or when a variable has
/// moved since). Returns false, with x.capture_off set, when the run cannot be recorded; nothing
/// has run then.
bool run_recorded(std::shared_ptr<SlotLease> lease, const std::vector<const Array*>& feed_by_node,
                  std::vector<Array>& result, Finish* deferred);

/// While the calling thread records a run: the recording (control ops record their bodies into
/// it as conditional nodes); nullptr otherwise.
detail::ExecutableImpl::Recording* recording_in_progress();
/// Records the steps of `body` (a control op's compiled body) on `stream`, a stream recording
/// into `rec`'s graph or into one of its conditional nodes' bodies: placeholders read `feeds` (by
/// program node id; device pointers that stay valid for as long as the recording), the body's
/// arena and results get buffers of the recording, and its error slots join the recording's.
/// Returns the views of the body's returned values.
std::vector<TensorView> record_body(const std::shared_ptr<detail::ExecutableImpl>& body,
                                    detail::ExecutableImpl::Recording& rec, void* stream,
                                    const std::vector<const void*>& feeds);

}  // namespace kiln
