// CompileOptions::deterministic on CUDA: training steps of a ResNet-shaped CNN, a BERT-tiny-shaped
// encoder and an LSTM (bench/gpu/determinism_nets.h), each built twice from the same fixed-seed
// values and run for three steps, give the same bits: losses, gradients and every variable after
// the steps (parameters, optimizer moments, batch-norm statistics). Each test also prints one line
//   kiln-determinism <model> <fnv1a-64 of all those bytes>
// so that two processes can be compared (the hashes must be equal). KILN_DETERMINISTIC=1 turns
// the mode on without the option; a deterministic executable never times a convolution.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../../bench/gpu/determinism_nets.h"
#include "core/device_backend.h"
#include "core/graph_impl.h"
#include "kiln/kiln.h"
#include "support/executable_env.h"
#include "support/gpu.h"

namespace kiln {
namespace {
using kiln::test::ScopedEnv;
using kiln_bench::NetSizes;
using kiln_bench::TrainStep;

// Every value a run of the steps produced, named, as host bytes.
struct Bits {
  std::vector<std::string> names;
  std::vector<std::vector<uint8_t>> bytes;
  void add(const std::string& name, const Array& a) {
    const Array h = a.to(Device::cpu());
    const auto* p = static_cast<const uint8_t*>(h.data());
    names.push_back(name);
    bytes.emplace_back(p, p + h.nbytes());
  }
  uint64_t fnv1a() const {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const auto& b : bytes)
      for (uint8_t c : b) h = (h ^ c) * 0x100000001b3ull;
    return h;
  }
};

// The steps of `model` (built fresh, so from its fixed initial values) on cuda:0.
Bits run_steps(TrainStep (*build)(const NetSizes&, int), const CompileOptions& options) {
  const TrainStep t = build(NetSizes::small(), 3);
  Executable exe = t.compile(Device::cuda(0), options);
  Bits r;
  for (size_t step = 0; step < t.batches.size(); ++step) {
    const std::vector<Array> out = exe.run(t.batches[step]);
    r.add(fmt::format("loss {}", step), out[0]);
    for (size_t i = 1; i < out.size(); ++i)
      r.add(fmt::format("step {} gradient of {}", step, t.params[i - 1].name()), out[i]);
  }
  for (const Tensor& v : t.graph.variables())
    r.add("variable " + v.name(), t.graph.read_variable(v));
  return r;
}

// Two runs of the steps compared byte by byte; prints the hash line.
void expect_same_bits(const char* model, TrainStep (*build)(const NetSizes&, int),
                      const CompileOptions& options) {
  const Bits a = run_steps(build, options);
  const Bits b = run_steps(build, options);
  ASSERT_EQ(a.names, b.names);
  int differing = 0;
  for (size_t i = 0; i < a.bytes.size(); ++i) {
    ASSERT_EQ(a.bytes[i].size(), b.bytes[i].size()) << a.names[i];
    size_t bad = 0;
    for (size_t j = 0; j < a.bytes[i].size(); ++j) bad += a.bytes[i][j] != b.bytes[i][j];
    if (bad > 0 && ++differing <= 10)
      ADD_FAILURE() << model << ": " << a.names[i] << " differs in " << bad << " of "
                    << a.bytes[i].size() << " bytes between two runs";
  }
  EXPECT_EQ(differing, 0) << model << ": values that differ between two runs";
  EXPECT_EQ(a.fnv1a(), b.fnv1a());
  std::printf("kiln-determinism %s %016llx\n", model, static_cast<unsigned long long>(a.fnv1a()));
  std::fflush(stdout);
}

CompileOptions deterministic() {
  CompileOptions o;
  o.deterministic = true;
  return o;
}

TEST(CudaDeterminism, ResNetTrainingStepsGiveTheSameBits) {
  REQUIRE_GPU();
  expect_same_bits("resnet_small", kiln_bench::resnet_small, deterministic());
}

TEST(CudaDeterminism, BertTrainingStepsGiveTheSameBits) {
  REQUIRE_GPU();
  expect_same_bits("bert_tiny", kiln_bench::bert_tiny, deterministic());
}

TEST(CudaDeterminism, LstmTrainingStepsGiveTheSameBits) {
  REQUIRE_GPU();
  expect_same_bits("lstm", kiln_bench::lstm_model, deterministic());
}

// The convolutions of a deterministic executable take cuDNN's heuristics, never a measurement;
// without the mode the first run measures (which shows the counts can tell them apart).
TEST(CudaDeterminism, ConvolutionsAreNeverTimed) {
  REQUIRE_GPU();
  DeviceBackend& backend = *cuda_backend();
  auto first_run = [](const CompileOptions& options) {
    const TrainStep t = kiln_bench::resnet_small(NetSizes::small(), 1);
    t.compile(Device::cuda(0), options).run(t.batches[0]);
  };
  backend.clear_tuning();
  first_run(deterministic());
  TuningStats s = backend.tuning_stats();
  EXPECT_EQ(s.measured, 0);
  EXPECT_EQ(s.graph_offered, 0);
  EXPECT_GE(s.heuristic, 3) << "a forward, a data-gradient and a weight-gradient problem at least";
  {
    const ScopedEnv env("KILN_DETERMINISTIC", "1");
    backend.clear_tuning();
    first_run({});
    s = backend.tuning_stats();
    EXPECT_EQ(s.measured, 0) << "KILN_DETERMINISTIC=1";
    EXPECT_GE(s.heuristic, 3) << "KILN_DETERMINISTIC=1";
  }
  {
    const ScopedEnv env("KILN_DETERMINISTIC", "0");
    backend.clear_tuning();
    first_run({});
    EXPECT_GE(backend.tuning_stats().measured, 3) << "without the mode";
  }
  backend.clear_tuning();
}

// The ordered max-pool gradient (a thread per plane) sums like the atomic scatter, for indices
// from a max pool and hand-made ones anywhere in the plane, NCHW and NHWC.
TEST(CudaDeterminism, MaxPoolGradientTakesAnyIndexInThePlane) {
  REQUIRE_GPU();
  const ScopedEnv env("KILN_CHANNELS_LAST", "0");  // (the NHWC twin is built by hand)
  Graph g;
  const Shape xs{2, 3, 7, 6};
  const Tensor x = g.placeholder(xs, f32, "x");
  const auto [y, idx] =
      max_pool_with_indices(x, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}});
  const Shape ys = y.shape();
  const Tensor dy = g.placeholder(ys, f32, "dy");
  const Tensor ind = g.placeholder(ys, i64, "indices");
  const Tensor dx = max_pool_grad(dy, ind, xs);
  // the same node on NHWC data, its result back in NCHW
  Attrs attrs = dx.graph_impl()->nodes[dx.node_id()].attrs;
  attrs.set("channels_last", true);
  const std::vector<int64_t> to_nhwc{0, 2, 3, 1};
  const Tensor dx_nhwc = transpose(
      detail::make_node(OpId::MaxPoolGrad, {transpose(dy, to_nhwc), transpose(ind, to_nhwc)},
                        attrs)[0],
      {0, 3, 1, 2});
  const int64_t plane = xs[2] * xs[3];
  kiln_bench::FixedValues r(7);
  const Array dy_v = r.uniform(ys, -1, 1);
  // mostly the windows' own taps (from a real max pool), every fifth anywhere in the plane
  std::vector<int64_t> iv = g.compile(Device::cpu(), {}, {idx})
                                .run({{x, r.uniform(xs, -1, 1)}})[0]
                                .to_vector<int64_t>();
  for (size_t i = 0; i < iv.size(); i += 5) iv[i] = static_cast<int64_t>(r.next() % plane);
  const Feeds feeds{{dy, dy_v}, {ind, Array::from_vector(iv, ys)}};
  const std::vector<float> want =
      g.compile(Device::cpu(), {}, {dx}).run(feeds)[0].to_vector<float>();
  for (const Tensor& t : {dx, dx_nhwc}) {
    const char* what = t.node_id() == dx.node_id() ? "NCHW" : "NHWC";
    for (int run = 0; run < 2; ++run) {
      const std::vector<float> got = g.compile(Device::cuda(0), {}, {t}, deterministic())
                                         .run(feeds)[0]
                                         .to(Device::cpu())
                                         .to_vector<float>();
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_NEAR(got[i], want[i], 1e-5) << what << " element " << i;
    }
    // an index outside the plane is an error, as on the CPU
    std::vector<int64_t> bad = iv;
    bad[3] = plane;
    EXPECT_THROW(g.compile(Device::cuda(0), {}, {t}, deterministic())
                     .run({{dy, dy_v}, {ind, Array::from_vector(bad, ys)}}),
                 ValueError)
        << what;
  }
}

}  // namespace
}  // namespace kiln
