// Queues and events: concurrency between queues, and event signal-to-wake latency.
//
//   overlap   two independent executables (a 40-layer MLP on 16 rows each: too small to fill the
//             GPU) run N times each: on one queue one after the other (the peer), then on two
//             queues at once. Prints ms per pair both ways and the ratio (goal <= 0.6).
//   gpu_to_host  a one-kernel run signals an event when it completes; the host waits on the event.
//             Submit-to-wake time, beside the synchronous Executable::run of the same run (which
//             waits on the stream directly) as the peer.
//   host_to_gpu  a run already queued waits for an event the host signals, and signals a second
//             event the host waits on: host -> device -> host, beside gpu_to_host.
//
// Lines starting "kiln " are machine-readable: kiln <name> <value> <unit> [peer <value>] [ratio r].
//   kiln_bench_async [--device cuda:0|cpu] [--reps N]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>
#include <string>
#include <vector>

#include "kiln/kiln.h"

namespace {
using namespace kiln;
using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

Array filled(const Shape& shape, float value) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return Array::from_vector(std::vector<float>(static_cast<size_t>(n), value), shape);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Executable mlp(Device device, uint64_t seed, Tensor* input) {
  Graph g;
  auto x = g.placeholder({16, 512}, f32, "x");
  Tensor h = x;
  for (int l = 0; l < 40; ++l) {
    auto w = g.constant(filled({512, 512}, static_cast<float>(0.5 / 512 + 1e-4 * ((seed + l) % 7))));
    h = relu(matmul(h, w));
  }
  *input = x;
  return g.compile(device, {}, {h});
}

void overlap(Device device, int reps) {
  Tensor xa, xb;
  Executable a = mlp(device, 1, &xa), b = mlp(device, 2, &xb);
  Array in = filled({16, 512}, 0.25f).to(device);
  Queue q1(device), q2(device);
  auto pairs = [&](Queue& qa, Queue& qb, int n) {
    std::vector<std::future<std::vector<Array>>> fs;
    for (int i = 0; i < n; ++i) {
      fs.push_back(a.run_async(qa, {{xa, in}}));
      fs.push_back(b.run_async(qb, {{xb, in}}));
    }
    for (auto& f : fs) f.get();
  };
  pairs(q1, q1, 5);  // warm-up: first runs, recordings
  pairs(q1, q2, 5);
  const int n = 20;
  std::vector<double> serial, concurrent;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    pairs(q1, q1, n);
    serial.push_back(us_since(t0) / 1000 / n);
    t0 = Clock::now();
    pairs(q1, q2, n);
    concurrent.push_back(us_since(t0) / 1000 / n);
  }
  const double s = median(serial), c = median(concurrent);
  fmt::print("# two 40-layer MLPs (16x512, f32) x{}: one queue {:.3f} ms per pair, two queues "
             "{:.3f} ms per pair\n",
             n, s, c);
  fmt::print("kiln overlap {:.4f} ms peer {:.4f} ratio {:.3f}\n", c, s, c / s);
}

void latency(Device device, int reps) {
  Graph g;
  auto x = g.placeholder({4}, f32, "x");
  Executable tiny = g.compile(device, {}, {x + 1.0});
  Array in = filled({4}, 1.0f).to(device);
  Queue q(device);
  Event done, go;
  uint64_t v = 0;
  for (int i = 0; i < 20; ++i) tiny.run({{x, in}});
  // GPU -> host: submit, the run signals at completion, the host wakes
  std::vector<double> async_us, sync_us, round_us;
  const int n = std::max(reps, 1) * 50;
  for (int i = 0; i < n; ++i) {
    ExecutionDescriptor d;
    d.signal_events = {{done, ++v}};
    auto t0 = Clock::now();
    auto f = tiny.run_async(q, {{x, in}}, d);
    done.wait(v);
    async_us.push_back(us_since(t0));
    f.get();
    t0 = Clock::now();
    tiny.run({{x, in}});
    sync_us.push_back(us_since(t0));
  }
  // host -> GPU -> host: the run is queued first, waiting for `go`
  uint64_t w = 0;
  for (int i = 0; i < n; ++i) {
    ExecutionDescriptor d;
    d.wait_events = {{go, ++w}};
    d.signal_events = {{done, ++v}};
    auto f = tiny.run_async(q, {{x, in}}, d);
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // the queue is waiting now
    auto t0 = Clock::now();
    go.signal(w);
    done.wait(v);
    round_us.push_back(us_since(t0));
    f.get();
  }
  const double a = median(async_us), s = median(sync_us), r = median(round_us);
  fmt::print("# one-kernel run, medians of {}: submit -> event wake {:.1f} us; synchronous run "
             "{:.1f} us; host signal -> queued run -> host wake {:.1f} us\n",
             n, a, s, r);
  fmt::print("kiln gpu_to_host {:.1f} us peer {:.1f} ratio {:.3f}\n", a, s, a / s);
  fmt::print("kiln host_to_gpu {:.1f} us peer {:.1f} ratio {:.3f}\n", r, a, r / a);
}
}  // namespace

int main(int argc, char** argv) {
  Device device = cuda_device_count() > 0 ? Device::cuda(0) : Device::cpu();
  int reps = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--device")) device = Device::parse(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::stoi(argv[i + 1]);
  }
  fmt::print("# kiln {} on {}\n", version(), device.str());
  try {
    overlap(device, reps);
    latency(device, reps);
  } catch (const std::exception& e) {
    fmt::print("kiln async error {}\n", e.what());
    return 1;
  }
  return 0;
}
