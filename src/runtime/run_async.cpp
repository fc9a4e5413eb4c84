// Runs submitted to a queue (Executable::run_async): waits for events, runs on the queue's
// submission thread (encoded on its stream on a device), signals events and calls handlers.
#include <fmt/format.h>

#include <exception>

#include "core/device_backend.h"
#include "core/errors.h"
#include "runtime/executor.h"
#include "runtime/queue_impl.h"

namespace kiln {

using detail::ExecutableImpl;

namespace {
// A run submitted to a queue, from submission until its handlers have been called.
struct AsyncRun {
  std::shared_ptr<ExecutableImpl> x;
  std::vector<Array> feeds;  // by program node id (invalid: not fed)
  ExecutionDescriptor desc;
  std::promise<std::vector<Array>> promise;
  bool scheduled = false;

  std::vector<const Array*> feed_pointers() const {
    std::vector<const Array*> p(feeds.size(), nullptr);
    for (size_t i = 0; i < feeds.size(); ++i)
      if (feeds[i].valid()) p[i] = &feeds[i];
    return p;
  }
  static void call(const char* which, const std::function<void()>& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      fmt::print(stderr, "[run_async] the {} handler threw: {}\n", which, e.what());
    } catch (...) {
      fmt::print(stderr, "[run_async] the {} handler threw\n", which);
    }
  }
  void mark_scheduled() {
    scheduled = true;
    for (auto& s : desc.signal_events)
      if (s.stage == Stage::scheduled) s.event.signal(s.value);
    if (desc.scheduled_handler) call("scheduled", [&] { desc.scheduled_handler(nullptr); });
  }
  void complete(std::vector<Array> outputs) {
    for (auto& s : desc.signal_events)
      if (s.stage == Stage::completed) s.event.signal(s.value);
    if (desc.completed_handler) call("completed", [&] { desc.completed_handler(outputs, nullptr); });
    promise.set_value(std::move(outputs));
  }
  // the run failed: every stage it had not reached fails with `error`
  void fail_with(std::exception_ptr error) {
    for (auto& s : desc.signal_events)
      if (s.stage == Stage::completed || !scheduled) s.event.state()->advance(s.value, error);
    if (!scheduled && desc.scheduled_handler)
      call("scheduled", [&] { desc.scheduled_handler(error); });
    if (desc.completed_handler) call("completed", [&] { desc.completed_handler({}, error); });
    promise.set_exception(error);
  }
  // on a GPU queue the waits were chained on the device: a run that failed to signal one of them
  // fails this run too
  void check_waits() const {
    for (auto& w : desc.wait_events) w.event.state()->host_wait(w.value);
  }
};

// On the queue's submission thread: waits, then the run (encoded on a GPU queue's stream, whose
// completion finishes it; executed on a CPU queue).
void start_async(const std::shared_ptr<AsyncRun>& job, Queue::Impl& q) {
  try {
    for (auto& w : job->desc.wait_events) q.wait_event(w.event, w.value);
    ExecutableImpl& x = *job->x;
    if (!x.backend) {
      job->mark_scheduled();
      std::vector<Array> outputs = run_cpu(x, job->feed_pointers());
      job->complete(std::move(outputs));
      return;
    }
    Finish finish;
    std::vector<Array> outputs = run_device(x, job->feed_pointers(), q.stream, &finish);
    for (auto& s : job->desc.signal_events)
      if (s.stage == Stage::completed) s.event.state()->add_pending(s.value, *x.backend, x.device.index, q.stream);
    job->mark_scheduled();
    q.after_device([job, finish = std::move(finish), outputs = std::move(outputs)]() mutable {
      try {
        if (finish) outputs = finish();
        // the run's slot goes back before anyone hears of its end: a caller that submits again
        // as soon as the future is ready reuses it instead of finding every slot still taken
        finish = nullptr;
        job->check_waits();
      } catch (...) {
        finish = nullptr;
        job->fail_with(std::current_exception());
        return;
      }
      job->complete(std::move(outputs));
    });
  } catch (...) {
    job->fail_with(std::current_exception());
  }
}

}  // namespace

std::future<std::vector<Array>> submit_async(const std::shared_ptr<ExecutableImpl>& impl,
                                             Queue& queue,
                                             const std::vector<const Array*>& by_node,
                                             ExecutionDescriptor desc) {
  const ExecutableImpl& x = *impl;
  if (queue.device() != x.device)
    fail<ValueError>("[run_async] the executable runs on {} but the queue is of {}", x.device.str(),
                     queue.device().str());
  for (int32_t ph : x.placeholders)
    if (!by_node[ph])
      fail<ValueError>("[run] placeholder '{}' has no feed", x.program.graph.nodes[ph].name);
  auto job = std::make_shared<AsyncRun>();
  job->x = impl;
  job->feeds.resize(by_node.size());
  for (size_t i = 0; i < by_node.size(); ++i)
    if (by_node[i]) job->feeds[i] = *by_node[i];
  job->desc = std::move(desc);
  auto future = job->promise.get_future();
  Queue::Impl& q = queue.impl();
  q.enqueue([job, &q] { start_async(job, q); });
  return future;
}

}  // namespace kiln
