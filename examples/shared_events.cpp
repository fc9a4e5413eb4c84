// Queues ordered by one shared event.
//
//   queue 1 (device):  compute       features := relu(x · W)           signals 2i-1
//   queue 2 (device):  post-process  probs = softmax(features / T)     waits 2i-1, signals 2i
//   cpu queue:         report        top class of each row             waits 2i
//
// The compute stage of batch i+1 waits for 2i (post-processing of batch i has read `features`),
// so one timeline orders both directions. The host prepares batch i+1 while batch i runs (double
// buffering). Every batch is checked against a float64 reference on the host.
//
//   kiln_example_shared_events [--device cpu|cuda:0] [--batches N]
#include <cmath>
#include <cstdio>
#include <cstring>
#include <future>
#include <random>
#include <string>
#include <vector>

#include <kiln/kiln.h>

using namespace kiln;

namespace {
constexpr int64_t kRows = 64, kIn = 256, kOut = 32;
constexpr double kTemperature = 4.0;

std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& e : v) e = d(rng);
  return v;
}

// softmax(relu(x · W) / T) in float64
std::vector<double> reference(const std::vector<float>& x, const std::vector<float>& w) {
  std::vector<double> p(kRows * kOut);
  for (int64_t r = 0; r < kRows; ++r) {
    double mx = -1e300;
    for (int64_t c = 0; c < kOut; ++c) {
      double s = 0;
      for (int64_t k = 0; k < kIn; ++k) s += double(x[r * kIn + k]) * w[k * kOut + c];
      p[r * kOut + c] = std::max(s, 0.0) / kTemperature;
      mx = std::max(mx, p[r * kOut + c]);
    }
    double z = 0;
    for (int64_t c = 0; c < kOut; ++c) z += p[r * kOut + c] = std::exp(p[r * kOut + c] - mx);
    for (int64_t c = 0; c < kOut; ++c) p[r * kOut + c] /= z;
  }
  return p;
}
}  // namespace

int main(int argc, char** argv) {
  Device device = default_device();
  int batches = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--device")) device = Device::parse(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--batches")) batches = std::stoi(argv[i + 1]);
  }
  std::mt19937 rng(2022);
  const std::vector<float> wv = random_floats(kIn * kOut, rng);

  Graph g;
  auto x = g.placeholder({kRows, kIn}, f32, "x");
  auto w = g.variable(Array::from_vector(wv, {kIn, kOut}), "w");
  auto features = g.variable(Array::zeros({kRows, kOut}, f32), "features");
  Executable compute = g.compile(device, {}, {}, {assign(features, relu(matmul(x, w)))});
  Executable post = g.compile(device, {}, {softmax(features * (1.0 / kTemperature), 1)});

  Queue q1(device), q2(device), cpu_queue(Device::cpu());
  Event timeline;  // 2i-1: batch i computed; 2i: batch i post-processed
  std::vector<std::future<void>> reports;
  int wrong = 0;
  std::vector<float> batch = random_floats(kRows * kIn, rng);
  for (int i = 1; i <= batches; ++i) {
    const auto v = static_cast<uint64_t>(i);
    ExecutionDescriptor c;
    c.wait_events = {{timeline, 2 * v - 2}};  // `features` is free again
    c.signal_events = {{timeline, 2 * v - 1}};
    compute.run_async(q1, {{x, Array::from_vector(batch, {kRows, kIn})}}, c);
    ExecutionDescriptor p;
    p.wait_events = {{timeline, 2 * v - 1}};
    p.signal_events = {{timeline, 2 * v}};
    auto probs = post.run_async(q2, Feeds{}, p).share();

    // a CPU-queue stage after the device stage: checks the batch against the reference
    auto want = std::make_shared<std::vector<double>>(reference(batch, wv));
    auto done = std::make_shared<std::promise<void>>();
    reports.push_back(done->get_future());
    cpu_queue.submit([timeline, v, probs, want, done, &wrong] {
      timeline.wait(2 * v);
      std::vector<float> got = probs.get()[0].to(Device::cpu()).to_vector<float>();
      for (size_t k = 0; k < got.size(); ++k)
        if (std::fabs(got[k] - (*want)[k]) > 1e-4) {
          ++wrong;  // only this queue's thread writes it
          break;
        }
      done->set_value();
    });
    // double buffering: batch i+1 is prepared on the host while batch i runs
    batch = random_floats(kRows * kIn, rng);
  }
  for (auto& r : reports) r.get();
  std::printf("%d batches on %s through 3 queues and one event: %d wrong\n", batches,
              device.str().c_str(), wrong);
  return wrong == 0 ? 0 : 1;
}
