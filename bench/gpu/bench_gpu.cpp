// GPU benchmark: kiln on cuda:0 on the workloads of the peer table in the GPU machine notes
// (ResNet-50 inference (f32, f32 with TF32 allowed, bf16) and training, an MLP Adam step, max-pool
// forward+backward, 1000 dependent tiny adds, ResNet-50 compile time, recurrent layers,
// attention, BERT-base from ONNX). bench/gpu/run.py runs PyTorch on the same workloads beside it
// and prints the ratios.
//
// Each workload prints friendly lines starting with "#" and one machine-readable line:
//   kiln <name> <ms>            median wall time of one run (or the compile time), milliseconds
//   kiln <name> error <text>    the workload failed
// Timing: the inputs are on the device before timing (Array::to), and Executable::run
// synchronizes once at its end, so the wall clock around run() is the run's time.
// --device cpu runs the same graphs on the CPU (a smoke test on machines without a GPU).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bench/gpu/launch_floor.h"
#include "bench/resnet50.h"
#include "core/device_backend.h"
#include "kiln/kiln.h"
#include "kiln/onnx.h"

namespace {
using namespace kiln;
using namespace kiln_bench;
using Clock = std::chrono::steady_clock;

struct Options {
  Device device = Device::cuda(0);
  int reps = 30;
  int warmup = 3;
  double max_seconds = 20;  // per workload: stop repeating after this much timing
  std::vector<std::string> only;
  std::string onnx_dir;  // models bench/gpu/run.py exports (bert_base.onnx)
  std::string profile;   // directory: after timing, 3 runs under the profiler (summary, trace)
  std::string current;   // the workload being timed (names the trace)
  // bert_base_dynamic_sweep: shapes (batch, seq) whose first calls are profiled right after the
  // sweep, before the timed new shapes
  std::vector<std::pair<int64_t, int64_t>> new_shapes;
};

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Median wall time of one call of f, after warm-up calls; a slow workload stops warming up after
// a quarter of max_seconds and timing after max_seconds (at least one timed run).
struct Timing {
  double median_ms = 0;
  int runs = 0;
};
Timing time_runs(const std::function<void()>& f, const Options& o) {
  const auto warm = Clock::now();
  for (int i = 0; i < o.warmup; ++i) {
    f();
    if (ms_since(warm) > o.max_seconds * 250) break;  // a slow workload: a quarter is enough
  }
  std::vector<double> t;
  const auto start = Clock::now();
  for (int i = 0; i < std::max(o.reps, 1); ++i) {
    const auto t0 = Clock::now();
    f();
    t.push_back(ms_since(t0));
    if (ms_since(start) > o.max_seconds * 1000) break;
  }
  std::sort(t.begin(), t.end());
  if (!o.profile.empty()) {  // where the time goes: op table, copies, idle gaps, and a trace
    Profiler::start();
    for (int i = 0; i < 3; ++i) f();
    const Profile p = Profiler::stop();
    std::istringstream lines(p.summary(5));
    for (std::string line; std::getline(lines, line);) fmt::print("#   {}\n", line);
    std::filesystem::create_directories(o.profile);
    p.save(o.profile + "/" + o.current + ".json");
  }
  return {t[t.size() / 2], static_cast<int>(t.size())};
}

// One line on where the kernels run: the count, and the CPU fallbacks by op and reason.
std::string placement_summary(const Executable& exe) {
  const auto steps = exe.placement();
  std::map<std::string, int> fallbacks;
  int on_cpu = 0;
  for (const auto& s : steps)
    if (!s.fallback_reason.empty()) {
      ++on_cpu;
      ++fallbacks[s.op + " (" + s.fallback_reason + ")"];
    }
  std::string r = fmt::format("{} kernels on {}", steps.size(), exe.device().str());
  if (on_cpu == 0) return r;
  r += fmt::format(", {} fall back to the cpu:", on_cpu);
  for (const auto& [what, n] : fallbacks) r += fmt::format(" {} x{};", what, n);
  return r;
}

void report(const std::string& name, const std::string& what, double compile_ms,
            const Executable& exe, const Timing& t, const std::string& extra = "") {
  fmt::print("# {}: {}\n", name, what);
  fmt::print("#   {:.3f} ms median of {} runs{}; compile {:.0f} ms; {}\n", t.median_ms, t.runs,
             extra, compile_ms, placement_summary(exe));
  fmt::print("kiln {} {:.4f}\n", name, t.median_ms);
}

const char* kBf16Note =
    "bf16 via CompileOptions::autocast (convolutions and linear in bf16, "
    "batch norm, activations and variables f32)";
const char* kBf16ModelNote = "bf16 model: weights, input and every op in bf16";

CompileOptions precision(bool use_bf16) {
  CompileOptions c;
  if (use_bf16) c.autocast = bf16;
  return c;
}

void resnet_infer(const Options& o, const std::string& name, int64_t batch, bool use_bf16,
                  bool tf32 = false) {
  Graph g;
  const DType dt = use_bf16 ? bf16 : f32;
  auto x = g.placeholder({batch, 3, 224, 224}, dt, "x");
  ResNet50 net(g, /*training=*/false, 1, dt);
  auto logits = net.forward(x);
  const auto t0 = Clock::now();
  auto exe = g.compile(o.device, {}, {logits}, {.allow_tf32 = tf32});
  const double compile_ms = ms_since(t0);
  Array xv = Rng(7).array({batch, 3, 224, 224}, 1.0f).astype(dt).to(o.device);
  const Timing t = time_runs([&] { exe.run({{x, xv}}); }, o);
  report(name,
         fmt::format("ResNet-50 inference, batch {}, {}", batch,
                     use_bf16 ? kBf16ModelNote
                     : tf32   ? "f32 with CompileOptions::allow_tf32"
                              : "f32"),
         compile_ms, exe, t);
}

// One executable with a dynamic batch against an executable compiled for each batch: warm runs
// of each (same inputs, in one process), and the first run of each new batch size (its
// specialization's compile included). The machine-readable figure is the worst ratio of warm
// dynamic to warm fixed.
// ResNet-50 bf16 with a dynamic batch: one executable runs batches 1..64, each new batch timed
// on its first call (with the convolution choices timed or seeded then) and warm. Then the process
// forgets every convolution choice and executables compiled for each batch measure their own, warm,
// for the ratio, each beside the dynamic executable's warm runs timed again right after it.
void resnet_dynamic(const Options& o, const std::string& name) {
  Graph g;
  auto x = g.placeholder({-1, 3, 224, 224}, bf16, "x", {{0, "batch", 1, 64}});
  ResNet50 net(g, /*training=*/false, 1, bf16);
  auto logits = net.forward(x);
  auto dynamic = g.compile(o.device, {}, {logits});
  DeviceBackend& backend = *cuda_backend();
  auto tuning = [&] {
    const TuningStats s = backend.tuning_stats();
    return std::pair<int64_t, int64_t>{s.measured + s.graph_offered, s.seeded + s.graph_seeded};
  };
  fmt::print("# {}: ResNet-50 inference, bf16 model, batch dynamic in [1, 64]\n", name);
  const std::vector<int64_t> batches{1, 8, 32, 64, 16, 24, 48, 4, 2, 12};
  auto input = [&](int64_t batch) {
    return Rng(7).array({batch, 3, 224, 224}, 1.0f).astype(bf16).to(o.device);
  };
  std::map<int64_t, double> warm;
  for (int64_t batch : batches) {
    const Array xv = input(batch);
    const auto [timed0, seeded0] = tuning();
    auto t0 = Clock::now();
    dynamic.run({{x, xv}});
    const double first_ms = ms_since(t0);
    const auto [timed1, seeded1] = tuning();
    warm[batch] = time_runs([&] { dynamic.run({{x, xv}}); }, o).median_ms;
    fmt::print(
        "#   batch {:2}: first call {:.0f} ms ({} convolution choices timed, {} seeded), "
        "warm {:.3f} ms\n",
        batch, first_ms, timed1 - timed0, seeded1 - seeded0, warm[batch]);
  }
  backend.clear_tuning();  // (fixed executables time their own choices)
  double worst = 0;
  for (int64_t batch : batches) {
    const Array xv = input(batch);
    auto fixed = g.compile(o.device, {{x, {batch, 3, 224, 224}}}, {logits});
    const Timing f = time_runs([&] { fixed.run({{x, xv}}); }, o);
    // the dynamic executable again right after, in the same state of the machine (its warm runs
    // above came right after its first call)
    const double d = time_runs([&] { dynamic.run({{x, xv}}); }, o).median_ms;
    worst = std::max(worst, d / f.median_ms);
    fmt::print(
        "#   batch {:2}: dynamic {:.3f} ms (after its first call {:.3f} ms), fixed {:.3f} ms, "
        "ratio {:.3f}\n",
        batch, d, warm[batch], f.median_ms, d / f.median_ms);
  }
  const auto c = dynamic.shape_cache();
  fmt::print(
      "#   cache: {} specializations, {} hits, {} misses, {} evictions, {} MiB (peak {} MiB, "
      "bound {} MiB); passes {}\n",
      c.entries, c.hits, c.misses, c.evictions, c.bytes >> 20, c.peak_bytes >> 20,
      c.max_bytes >> 20, c.symbolic ? "once on the symbolic program" : "again for each shape");
  fmt::print("kiln {} {:.4f}\n", name, worst);
}

void resnet_train(const Options& o, const std::string& name, bool use_bf16) {
  constexpr int64_t batch = 32;
  Graph g;
  auto x = g.placeholder({batch, 3, 224, 224}, f32, "x");
  auto y = g.placeholder({batch}, i64, "y");
  ResNet50 net(g, /*training=*/true);
  auto loss = softmax_cross_entropy(net.forward(x), y);
  auto grads = gradients(loss, net.params());
  std::vector<Tensor> updates = optim::sgd(g, net.params(), grads, {.lr = 0.01, .momentum = 0.9});
  updates.insert(updates.end(), net.bn_updates().begin(), net.bn_updates().end());
  const auto t0 = Clock::now();
  auto exe = g.compile(o.device, {}, {loss}, updates, precision(use_bf16));
  const double compile_ms = ms_since(t0);
  Array xv = Rng(7).array({batch, 3, 224, 224}, 1.0f).to(o.device);
  Array yv = labels(batch, 1000).to(o.device);
  const Timing t = time_runs([&] { exe.run({{x, xv}, {y, yv}}); }, o);
  report(name,
         fmt::format("ResNet-50 training step (batch-norm training, cross entropy, SGD momentum "
                     "0.9), batch 32, {}",
                     use_bf16 ? kBf16Note : "f32"),
         compile_ms, exe, t);
}

void resnet_compile(const Options& o, const std::string& name) {
  Graph g;
  auto x = g.placeholder({32, 3, 224, 224}, f32, "x");
  ResNet50 net(g, /*training=*/false);
  auto logits = net.forward(x);
  Array::empty({1}, f32).to(o.device);  // starts the device, so its start-up is not counted
  auto t0 = Clock::now();
  auto exe = g.compile(o.device, {}, {logits});
  const double first_ms = ms_since(t0);
  t0 = Clock::now();
  auto again = g.compile(o.device, {}, {logits});
  const double second_ms = ms_since(t0);
  fmt::print("# {}: compile of ResNet-50 inference, batch 32, f32, for {} (graph built before)\n",
             name, o.device.str());
  fmt::print("#   first compile {:.0f} ms, second {:.0f} ms; {}\n", first_ms, second_ms,
             placement_summary(exe));
  fmt::print("kiln {} {:.4f}\n", name, first_ms);
}

// ---- small workloads ----

void mlp_adam(const Options& o, const std::string& name) {
  Graph g;
  Rng rng(3);
  auto x = g.placeholder({256, 784}, f32, "x");
  auto y = g.placeholder({256}, i64, "y");
  const float b1 = 1.0f / std::sqrt(784.0f) / 1.7320508f, b2 = 1.0f / 16.0f / 1.7320508f;
  auto w1 = g.variable(rng.array({256, 784}, b1), "w1");
  auto c1 = g.variable(rng.array({256}, b1), "b1");
  auto w2 = g.variable(rng.array({10, 256}, b2), "w2");
  auto c2 = g.variable(rng.array({10}, b2), "b2");
  auto loss = softmax_cross_entropy(linear(softshrink(linear(x, w1, c1)), w2, c2), y);
  std::vector<Tensor> params{w1, c1, w2, c2};
  auto step = optim::adam(g, params, gradients(loss, params), {.lr = 1e-3});
  const auto t0 = Clock::now();
  auto exe = g.compile(o.device, {}, {loss}, step);
  const double compile_ms = ms_since(t0);
  Array xv = rng.array({256, 784}, 1.0f).to(o.device);
  Array yv = labels(256, 10).to(o.device);
  const Timing t = time_runs([&] { exe.run({{x, xv}, {y, yv}}); }, o);
  report(name, "MLP 784-256(Softshrink)-10, cross entropy, Adam step, batch 256, f32", compile_ms,
         exe, t);
}

// LSTM 2 layers x 512, seq 100, batch 64, f32: forward (training mode) + backward to the
// weights and the input, as nn.LSTM's forward + backward.
// A 2-layer recurrent stack of 512 units (LSTM, or GRU as PyTorch's: linear_before_reset),
// seq 100, batch 64, f32: forward in training mode and the gradients of every weight and x.
void recurrent_train(const Options& o, const std::string& name, RnnCell cell) {
  constexpr int64_t T = 100, B = 64, I = 512, H = 512;
  const int64_t G = cell == RnnCell::lstm ? 4 : 3;
  Graph g;
  Rng rng(11);
  auto x = g.placeholder({T, B, I}, f32, "x");
  auto gy = g.placeholder({T, B, 1, H}, f32, "gy");
  const float k = 1.0f / std::sqrt(static_cast<float>(H)) / 1.7320508f;
  std::vector<RnnLayerWeights> layers;
  std::vector<Tensor> wrt;
  for (int64_t l = 0; l < 2; ++l) {
    auto w = g.variable(rng.array({1, G * H, l == 0 ? I : H}, k));
    auto r = g.variable(rng.array({1, G * H, H}, k));
    auto b = g.variable(rng.array({1, 2 * G * H}, k));
    layers.push_back({w, r, b, std::nullopt});
    wrt.insert(wrt.end(), {w, r, b});
  }
  RnnOptions ro;
  ro.training = true;
  ro.linear_before_reset = true;
  auto res = cell == RnnCell::lstm
                 ? lstm(x, layers, std::nullopt, std::nullopt, std::nullopt, ro)
                 : gru(x, layers, std::nullopt, std::nullopt, ro);
  wrt.push_back(x);
  auto grads = gradients(sum(res.y * gy), wrt);
  const auto t0 = Clock::now();
  auto exe = g.compile(o.device, {}, grads);
  const double compile_ms = ms_since(t0);
  Array xv = rng.array({T, B, I}, 1.0f).to(o.device);
  Array gv = rng.array({T, B, 1, H}, 1.0f).to(o.device);
  const Timing t = time_runs([&] { exe.run({{x, xv}, {gy, gv}}); }, o);
  report(name,
         fmt::format("{} 2 layers x 512, seq 100, batch 64, f32, forward + backward",
                     cell == RnnCell::lstm ? "LSTM" : "GRU"),
         compile_ms, exe, t);
}
void lstm_train(const Options& o, const std::string& name) {
  recurrent_train(o, name, RnnCell::lstm);
}
void gru_train(const Options& o, const std::string& name) {
  recurrent_train(o, name, RnnCell::gru);
}

// Attention as in BERT-base: batch 32, 12 heads, 128 tokens, head dim 64, forward, in `type`
// (bf16 or f32).
void sdpa(const Options& o, const std::string& name, DType type) {
  const Shape s{32, 12, 128, 64};
  Graph g;
  Rng rng(13);
  auto q = g.placeholder(s, type, "q"), k = g.placeholder(s, type, "k"),
       v = g.placeholder(s, type, "v");
  const auto t0 = Clock::now();
  auto exe = g.compile(o.device, {}, {scaled_dot_product_attention(q, k, v)});
  const double compile_ms = ms_since(t0);
  Array qv = rng.array(s, 1.0f).astype(type).to(o.device);
  Array kv = rng.array(s, 1.0f).astype(type).to(o.device);
  Array vv = rng.array(s, 1.0f).astype(type).to(o.device);
  const Timing t = time_runs([&] { exe.run({{q, qv}, {k, kv}, {v, vv}}); }, o);
  report(name,
         fmt::format("scaled dot-product attention 32x12x128x64 {}, forward", kiln::name(type)),
         compile_ms, exe, t);
}

// BERT-base (transformers' BertModel: 12 layers, hidden 768, 12 heads, random weights) imported
// from the ONNX file bench/gpu/run.py exports in f32 (last_hidden_state), compiled with bf16
// autocast: batch 32, 128 tokens, attention mask all ones.
void bert_base_onnx(const Options& o, const std::string& name) {
  if (o.onnx_dir.empty())
    throw Error("[bench] " + name + " needs --onnx-dir DIR with bert_base.onnx in it "
                "(bench/gpu/run.py exports it)");
  constexpr int64_t kBatch = 32, kTokens = 128, kVocab = 30522;
  onnx::ImportOptions io;
  io.input_shapes = {{"input_ids", {kBatch, kTokens}}, {"attention_mask", {kBatch, kTokens}}};
  const auto t0 = Clock::now();
  const onnx::Model m = onnx::import(o.onnx_dir + "/bert_base.onnx", io);
  CompileOptions c;
  c.autocast = bf16;
  auto exe = m.graph.compile(o.device, m.feed_shapes(), m.output_tensors(), c);
  const double compile_ms = ms_since(t0);
  std::vector<int64_t> ids(kBatch * kTokens);
  uint64_t state = 12345;
  for (int64_t& id : ids) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    id = static_cast<int64_t>((state >> 33) % kVocab);
  }
  std::map<std::string, Array> by_name{
      {"input_ids", Array::from_vector(ids, {kBatch, kTokens})},
      {"attention_mask",
       Array::from_vector(std::vector<int64_t>(kBatch * kTokens, 1), {kBatch, kTokens})}};
  std::map<std::string, Array> present;
  for (const auto& in : m.inputs) present.emplace(in.name, by_name.at(in.name).to(o.device));
  const Feeds feeds = m.feeds(present);
  const Timing t = time_runs([&] { exe.run(feeds); }, o);
  report(name,
         fmt::format("BERT-base from ONNX ({} ONNX nodes), batch {}, {} tokens, bf16 autocast",
                     [&] {
                       int64_t n = 0;
                       for (const auto& [op, count] : m.op_histogram) n += count;
                       return n;
                     }(),
                     kBatch, kTokens),
         compile_ms, exe, t);
}

// The (batch, seq) of call i of the dynamic BERT sweep: batch in [1, 32], seq in [16, 512], from
// a 64-bit LCG that bench/gpu/bert_dynamic.py repeats for PyTorch.
std::vector<std::pair<int64_t, int64_t>> bert_sweep_shapes(int calls) {
  std::vector<std::pair<int64_t, int64_t>> r;
  uint64_t state = 2026;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int64_t>(state >> 33);
  };
  for (int i = 0; i < calls; ++i) {
    const int64_t b = 1 + next() % 32;
    r.emplace_back(b, 16 + next() % 497);
  }
  return r;
}

// BERT-base from the ONNX file bench/gpu/bert_dynamic.py exports with batch and sequence dynamic
// (dim_params), imported without shapes: one dynamic executable (bf16 autocast) runs a sweep of
// 50 calls of random shapes; each call is timed (the first of a shape compiles its
// specialization). Then, for three of the shapes, warm runs against an executable compiled for
// that shape.
void bert_dynamic_sweep(const Options& o, const std::string& name) {
  if (o.onnx_dir.empty())
    throw Error("[bench] " + name +
                " needs --onnx-dir DIR with bert_base_dynamic.onnx in it "
                "(bench/gpu/bert_dynamic.py exports it)");
  constexpr int kCalls = 50;
  constexpr int64_t kVocab = 30522;
  const auto t0 = Clock::now();
  const onnx::Model m = onnx::import(o.onnx_dir + "/bert_base_dynamic.onnx");
  CompileOptions c;
  c.autocast = bf16;
  auto exe = m.graph.compile(o.device, {}, m.output_tensors(), c);
  const double import_ms = ms_since(t0);
  if (!exe.is_dynamic()) throw Error("[bench] the exported BERT is not dynamic");
  auto inputs_of = [&](int64_t b, int64_t l) {  // (by name: what both models take)
    std::vector<int64_t> ids(b * l);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 7919) % kVocab);
    std::map<std::string, Array> all{
        {"input_ids", Array::from_vector(ids, {b, l}).to(o.device)},
        {"attention_mask",
         Array::from_vector(std::vector<int64_t>(b * l, 1), {b, l}).to(o.device)}};
    std::map<std::string, Array> present;
    for (const auto& in : m.inputs) present.emplace(in.name, all.at(in.name));
    return present;
  };
  // the host spans of a profile, longest first
  auto print_spans = [](const Profile& p, const std::string& what, double ms) {
    std::map<std::string, double> by_phase;
    for (const ProfileSpan& sp : p.spans)
      if (sp.process == "host" && sp.name != "specialize")
        by_phase[fmt::format("{}:{}", span_kind_name(sp.kind), sp.name)] += sp.dur_us;
    std::vector<std::pair<double, std::string>> top;
    for (const auto& [phase, us] : by_phase) top.emplace_back(us, phase);
    std::sort(top.rbegin(), top.rend());
    fmt::print("#   {} under the profiler: {:.1f} ms; host spans:", what, ms);
    for (size_t i = 0; i < top.size() && i < 14; ++i)
      fmt::print(" {} {:.1f} ms{}", top[i].second, top[i].first / 1000,
                 i + 1 < top.size() ? "," : "");
    fmt::print("\n");
  };
  double total = 0, first_total = 0, first_max = 0;
  int firsts = 0;
  std::set<std::pair<int64_t, int64_t>> seen;
  for (auto [b, l] : bert_sweep_shapes(kCalls)) {
    const Feeds f = m.feeds(inputs_of(b, l));
    // the sweep's first call (its specialization folds the autocast weights) is profiled
    std::optional<ProfileScope> ps;
    if (seen.empty()) ps.emplace();
    const auto t1 = Clock::now();
    exe.run(f);
    const double ms = ms_since(t1);
    if (ps) print_spans(ps->stop(), fmt::format("the first call ({}, {})", b, l), ms);
    total += ms;
    if (seen.insert({b, l}).second) {
      ++firsts;
      first_total += ms;
      first_max = std::max(first_max, ms);
    }
  }
  // the first call of a new shape over a warm call of it (the goal: at most 5 ms), for shapes
  // the sweep did not have, timed without the profiler; then where the first calls of more new
  // shapes go (their host spans, under the profiler, whose own cost counts in them)
  auto unseen = [&](int64_t b, int64_t l) {
    while (seen.count({b, l})) ++l;
    seen.insert({b, l});
    return std::pair<int64_t, int64_t>{b, l};
  };
  auto profile_first_call = [&](int64_t b, int64_t l) {
    const Feeds f = m.feeds(inputs_of(b, l));
    ProfileScope ps;
    const auto t1 = Clock::now();
    exe.run(f);
    const double ms = ms_since(t1);
    const Profile p = ps.stop();
    print_spans(p, fmt::format("a new shape ({}, {})", b, l), ms);
    if (!o.profile.empty()) {
      std::filesystem::create_directories(o.profile);
      p.save(fmt::format("{}/{}_first_{}x{}.json", o.profile, name, b, l));
    }
  };
  for (auto [b, l] : o.new_shapes)
    if (seen.insert({b, l}).second) profile_first_call(b, l);
  double over_max = 0, over_sum = 0;
  int overs = 0;
  for (auto [b, l] : {unseen(3, 77), unseen(24, 400), unseen(13, 211), unseen(1, 500),
                      unseen(2, 90), unseen(7, 48), unseen(16, 160), unseen(4, 256)}) {
    const Feeds f = m.feeds(inputs_of(b, l));
    const auto t1 = Clock::now();
    exe.run(f);
    const double first = ms_since(t1);
    const Timing w = time_runs([&] { exe.run(f); }, o);
    over_max = std::max(over_max, first - w.median_ms);
    over_sum += first - w.median_ms;
    ++overs;
    fmt::print(
        "#   new shape ({}, {}): first call {:.2f} ms, warm {:.2f} ms, over warm {:.2f} ms\n", b, l,
        first, w.median_ms, first - w.median_ms);
  }
  // (small token counts first: their product sizes are the sweep's rarest)
  for (auto [b, l] : {unseen(1, 120), unseen(2, 40), unseen(5, 123), unseen(30, 333)})
    profile_first_call(b, l);
  fmt::print("#   first call of a new shape over a warm call: mean {:.2f} ms\n",
             over_sum / std::max(overs, 1));
  fmt::print("#   first call of a new shape over a warm call: at most {:.2f} ms (goal 5 ms)\n",
             over_max);
  const auto cs = exe.shape_cache();
  fmt::print(
      "# {}: BERT-base from ONNX, batch and sequence dynamic, bf16 autocast; {} calls of "
      "random (batch 1-32, seq 16-512)\n#   import + compile {:.0f} ms; sweep {:.0f} ms; {} first "
      "calls of a shape: mean {:.0f} ms, max {:.0f} ms\n#   cache: {} specializations, {} hits, "
      "{} misses, {} evictions, {} MiB (peak {} MiB, bound {} MiB); passes {}\n",
      name, kCalls, import_ms, total, firsts, first_total / std::max(firsts, 1), first_max,
      cs.entries, cs.hits, cs.misses, cs.evictions, cs.bytes >> 20, cs.peak_bytes >> 20,
      cs.max_bytes >> 20,
      cs.symbolic
          ? fmt::format("once on the symbolic program ({} misses from it)", cs.symbolic_misses)
          : "again for each shape: " + cs.not_symbolic);
  double worst = 0;
  for (auto [b, l] :
       {std::pair<int64_t, int64_t>{1, 16}, {8, 128}, {32, 512}, {3, 77}, {24, 400}}) {
    const auto inputs = inputs_of(b, l);
    const Feeds f = m.feeds(inputs);
    const Timing d = time_runs([&] { exe.run(f); }, o);
    onnx::ImportOptions io;
    io.input_shapes = {{"input_ids", {b, l}}, {"attention_mask", {b, l}}};
    const onnx::Model fm = onnx::import(o.onnx_dir + "/bert_base_dynamic.onnx", io);
    auto fixed = fm.graph.compile(o.device, fm.feed_shapes(), fm.output_tensors(), c);
    const Feeds ff = fm.feeds(inputs);
    const Timing t = time_runs([&] { fixed.run(ff); }, o);
    worst = std::max(worst, d.median_ms / t.median_ms);
    fmt::print("#   batch {:2} seq {:3}: dynamic {:.3f} ms, fixed {:.3f} ms, ratio {:.3f}\n", b, l,
               d.median_ms, t.median_ms, d.median_ms / t.median_ms);
  }
  fmt::print("kiln {} {:.1f}\n", name, total);
}

void maxpool_fwd_bwd(const Options& o, const std::string& name) {
  const Shape in{32, 64, 112, 112};
  PoolOptions p;
  p.kernel = {3, 3};
  p.stride = {2, 2};
  p.padding = {1, 1};
  Graph g;
  auto x = g.placeholder(in, f32, "x");
  auto [yv_t, idx] = max_pool_with_indices(x, p);
  auto gy = g.placeholder(yv_t.shape(), f32, "gy");  // the incoming gradient, as backward(gy)
  auto dx = max_pool_grad(gy, idx, in);
  const auto t0 = Clock::now();
  auto exe = g.compile(o.device, {}, {yv_t, dx});
  const double compile_ms = ms_since(t0);
  Rng rng(5);
  Array xv = rng.array(in, 1.0f).to(o.device);
  Array gv = rng.array(yv_t.shape(), 1.0f).to(o.device);
  const Timing t = time_runs([&] { exe.run({{x, xv}, {gy, gv}}); }, o);
  report(name,
         "max-pool 3x3 s2 p1 forward with indices + backward (max_pool_grad), 32x64x112x112 f32",
         compile_ms, exe, t);
}

void tiny_adds(const Options& o, const std::string& name, bool recorded, bool fused = false) {
  constexpr int kOps = 1000;
  Graph g;
  auto x = g.placeholder({1}, f32, "x");
  auto one = g.constant(filled({1}, 1.0f), "one");
  Tensor h = x;
  for (int i = 0; i < kOps; ++i) h = h + one;
  // optimize=false: nothing may fold, merge or fuse the chain; every add is a kernel of its own
  CompileOptions c;
  c.optimize = fused;  // fusion runs with the optimizing passes
  c.capture = recorded;
  const auto t0 = Clock::now();
  auto exe = g.compile(o.device, {}, {h}, c);
  const double compile_ms = ms_since(t0);
  Array xv = filled({1}, 0.0f).to(o.device);
  const Timing t = time_runs([&] { exe.run({{x, xv}}); }, o);
  const float result = exe.run({{x, xv}})[0].to_vector<float>()[0];
  if (result != static_cast<float>(kOps))
    throw Error(fmt::format("[bench] the chain of adds gave {} instead of {}", result, kOps));
  report(name,
         fmt::format("1000 dependent adds x = x + 1 on a 1-element f32 tensor, {}",
                     fused      ? "fused into one generated kernel"
                     : recorded ? "replayed as one CUDA graph (optimize=false)"
                                : "launched one by one (optimize=false)"),
         compile_ms, exe, t, fmt::format(" = {:.2f} us per op", t.median_ms * 1000 / kOps));
  if (!recorded && !fused) {
    // the same chain as bare cudaLaunchKernel calls: what one launch at a time costs here
    const bench::LaunchFloor f = bench::launch_floor(kOps, std::max(o.reps, 5));
    fmt::print("#   bare CUDA launches of the same chain: {:.2f} us per op ({:.2f} us of host "
               "time per cudaLaunchKernel)\n",
               f.total_us, f.enqueue_us);
  }
}

struct Workload {
  std::string name;
  std::function<void(const Options&, const std::string&)> run;
};

std::vector<Workload> workloads() {
  using O = const Options&;
  using S = const std::string&;
  return {
      {"resnet50_infer_bs1_f32", [](O o, S n) { resnet_infer(o, n, 1, false); }},
      {"resnet50_infer_bs1_bf16", [](O o, S n) { resnet_infer(o, n, 1, true); }},
      {"resnet50_infer_bs32_f32", [](O o, S n) { resnet_infer(o, n, 32, false); }},
      {"resnet50_infer_bs32_bf16", [](O o, S n) { resnet_infer(o, n, 32, true); }},
      {"resnet50_infer_bs1_tf32", [](O o, S n) { resnet_infer(o, n, 1, false, true); }},
      {"resnet50_infer_bs32_tf32", [](O o, S n) { resnet_infer(o, n, 32, false, true); }},
      {"resnet50_dynamic_batch_bf16", [](O o, S n) { resnet_dynamic(o, n); }},
      {"resnet50_train_bs32_f32", [](O o, S n) { resnet_train(o, n, false); }},
      {"resnet50_train_bs32_bf16", [](O o, S n) { resnet_train(o, n, true); }},
      {"resnet50_compile", resnet_compile},
      {"mlp_adam_bs256", mlp_adam},
      {"maxpool_fwd_bwd", maxpool_fwd_bwd},
      {"lstm_train", lstm_train},
      {"sdpa_bf16", [](O o, S n) { sdpa(o, n, bf16); }},
      {"sdpa_f32", [](O o, S n) { sdpa(o, n, f32); }},
      {"bert_base_bf16_onnx", bert_base_onnx},
      {"bert_base_dynamic_sweep", bert_dynamic_sweep},
      {"gru_train", gru_train},
      {"tiny_add_x1000", [](O o, S n) { tiny_adds(o, n, true); }},
      {"tiny_add_x1000_plain", [](O o, S n) { tiny_adds(o, n, false); }},
      {"tiny_add_x1000_fused", [](O o, S n) { tiny_adds(o, n, false, true); }},
  };
}

// A workload runs when no --only was given, or when a selector is a prefix of its name.
bool selected(const Options& o, const std::string& name) {
  if (o.only.empty()) return true;
  for (const auto& s : o.only)
    if (name.rfind(s, 0) == 0) return true;
  return false;
}

std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\r', ' ');
  return s;
}

void usage() {
  fmt::print(
      "kiln_bench_gpu [--device cuda:0|cpu] [--reps N] [--warmup N] [--max-seconds S]\n"
      "               [--only NAME[,NAME...]] [--list] [--onnx-dir DIR] [--profile DIR]\n"
      "               [--new-shapes BxL[,BxL...]]\n"
      "Times kiln workloads on a device. --only takes names or name prefixes (e.g. "
      "resnet50_infer).\n"
      "Prints '# ...' lines for people and 'kiln <name> <ms>' (or 'kiln <name> error <text>').\n"
      "--profile DIR: after timing, profiles 3 runs of each workload: the summary as '#' lines,\n"
      "the Chrome trace in DIR/<name>.json.\n"
      "--new-shapes BxL,...: bert_base_dynamic_sweep profiles the first calls of these (batch,\n"
      "seq) shapes right after its sweep (their traces in the --profile DIR when given).\n");
}
}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IONBF, 0);  // a hung device call must not swallow the output
  Options o;
  bool list = false;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw ValueError("[bench] " + a + " needs a value");
        return argv[++i];
      };
      if (a == "--device")
        o.device = Device::parse(value());
      else if (a == "--reps")
        o.reps = std::stoi(value());
      else if (a == "--warmup")
        o.warmup = std::stoi(value());
      else if (a == "--max-seconds")
        o.max_seconds = std::stod(value());
      else if (a == "--onnx-dir")
        o.onnx_dir = value();
      else if (a == "--profile")
        o.profile = value();
      else if (a == "--new-shapes") {
        std::stringstream ss(value());
        for (std::string s; std::getline(ss, s, ',');) {
          const auto x = s.find('x');
          if (x == std::string::npos) throw ValueError("[bench] --new-shapes takes BxL, not " + s);
          o.new_shapes.emplace_back(std::stoll(s.substr(0, x)), std::stoll(s.substr(x + 1)));
        }
      } else if (a == "--list") list = true;
      else if (a == "--only") {
        std::stringstream ss(value());
        for (std::string s; std::getline(ss, s, ',');)
          if (!s.empty()) o.only.push_back(s);
      } else if (a == "-h" || a == "--help") {
        usage();
        return 0;
      } else {
        throw ValueError("[bench] unknown argument " + a);
      }
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    usage();
    return 2;
  }
  const auto all = workloads();
  if (list) {
    for (const auto& w : all) fmt::print("{}\n", w.name);
    return 0;
  }
  bool any = false;
  for (const auto& w : all) any = any || selected(o, w.name);
  if (!any) {
    fmt::print(stderr, "[bench] --only matches no workload (see --list)\n");
    return 2;
  }
  fmt::print(
      "# kiln {} on {}: median of {} runs after {} warm-up runs, wall clock around "
      "Executable::run (which synchronizes); inputs already on the device\n",
      version(), o.device.str(), o.reps, o.warmup);
  int failed = 0;
  for (const auto& w : all) {
    if (!selected(o, w.name)) continue;
    try {
      o.current = w.name;
      w.run(o, w.name);
    } catch (const std::exception& e) {
      ++failed;
      fmt::print("kiln {} error {}\n", w.name, one_line(e.what()));
    }
  }
  return failed == 0 ? 0 : 1;
}
