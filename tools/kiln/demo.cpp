// `kiln demo`: the main job. Trains a small convnet on the 8x8 handwritten digits that
// scikit-learn ships (written as .npy by scripts/digits.py), on the default device, and reports
// the loss per epoch, test accuracy, time per step and the device. Then it saves the trained
// variables, reloads them into a fresh graph and checks that accuracy is unchanged. With
// --autocast the convolutions and the linear layer run in bf16, or in f16 with dynamic loss
// scaling.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <optional>
#include <random>

#include "kiln/kiln.h"
#include "tools/kiln/commands.h"

namespace kiln::cli {

namespace {
using clock_type = std::chrono::steady_clock;
double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

struct DemoOptions {
  std::string data = "build/data";
  int epochs = 12;
  int batch = 32;
  double lr = 0.05;
  std::string checkpoint = "build/demo.ckpt";
  std::string autocast;  // "", "bf16" or "f16"
  std::string device;    // "": default_device()
  std::string trace;     // "": no profile; else the trace of compiling and the first steps
};
constexpr int64_t kTracedSteps = 5;

std::optional<DType> low_precision(const std::string& autocast) {
  if (autocast.empty()) return std::nullopt;
  return autocast == "f16" ? f16 : bf16;
}

// SGD with momentum; under f16 through loss scaling, so small gradients survive f16.
std::vector<Tensor> training_step(Graph& g, const Tensor& loss, const std::vector<Tensor>& params,
                                  const DemoOptions& o) {
  auto sgd = [&o](Graph& gr, const std::vector<Tensor>& vars, const std::vector<Tensor>& grads) {
    return optim::sgd(gr, vars, grads, {.lr = o.lr, .momentum = 0.9});
  };
  if (low_precision(o.autocast) == f16)
    return optim::scale_loss_and_step(g, loss, params, sgd).updates;
  return sgd(g, params, gradients(loss, params));
}

Array kaiming(const Shape& shape, double fan_in, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, static_cast<float>(std::sqrt(2.0 / fan_in)));
  Array a = Array::empty(shape, f32);
  float* p = a.data<float>();
  for (int64_t i = 0; i < a.numel(); ++i) p[i] = d(rng);
  return a;
}

// The model's variables, created in a fixed order with fixed names (checkpoints match by name).
struct Model {
  Tensor w1, b1, w2, b2, wf, bf;
  explicit Model(Graph& g, uint32_t seed) {
    std::mt19937 rng(seed);
    w1 = g.variable(kaiming({16, 1, 3, 3}, 9, rng), "conv1.weight");
    b1 = g.variable(Array::zeros({16}, f32), "conv1.bias");
    w2 = g.variable(kaiming({32, 16, 3, 3}, 144, rng), "conv2.weight");
    b2 = g.variable(Array::zeros({32}, f32), "conv2.bias");
    wf = g.variable(kaiming({10, 128}, 128, rng), "fc.weight");
    bf = g.variable(Array::zeros({10}, f32), "fc.bias");
  }
  std::vector<Tensor> params() const { return {w1, b1, w2, b2, wf, bf}; }
  // (N, 1, 8, 8) -> logits (N, 10)
  Tensor logits(const Tensor& x) const {
    ConvOptions same;
    same.padding = {1, 1};
    PoolOptions pool2;
    pool2.kernel = {2, 2};
    Tensor h = max_pool(relu(conv2d(x, w1, b1, same)), pool2);  // (N, 16, 4, 4)
    h = max_pool(relu(conv2d(h, w2, b2, same)), pool2);         // (N, 32, 2, 2)
    return linear(reshape(h, {-1, 128}), wf, bf);
  }
};

double accuracy(const Executable& eval, const Tensor& x, const Array& images, const Array& labels) {
  auto pred = eval.run({{x, images}})[0].to_vector<int64_t>();
  auto want = labels.to_vector<int64_t>();
  int64_t ok = 0;
  for (size_t i = 0; i < pred.size(); ++i) ok += pred[i] == want[i];
  return 100.0 * static_cast<double>(ok) / static_cast<double>(pred.size());
}

// The digits as scripts/digits.py writes them: images f32 (n, 1, 8, 8), labels i64 (n,) in
// [0, 10), with at least one batch to train on and one digit to test on.
void check_digits(const Array& images, const Array& labels, const DemoOptions& o) {
  const Shape& s = images.shape();
  if (images.dtype() != f32 || s.size() != 4 || s[1] != 1 || s[2] != 8 || s[3] != 8)
    throw ShapeError(
        fmt::format("[demo] {}/digits_images.npy holds {} {}; the demo takes f32 "
                    "(n, 1, 8, 8)",
                    o.data, name(images.dtype()), to_string(s)));
  if (labels.dtype() != i64 || labels.shape() != Shape{s[0]})
    throw ShapeError(
        fmt::format("[demo] {}/digits_labels.npy holds {} {}; the demo takes i64 "
                    "({},), one label per image",
                    o.data, name(labels.dtype()), to_string(labels.shape()), s[0]));
  const int64_t n_test = s[0] / 5;
  if (n_test < 1 || s[0] - n_test < o.batch)
    throw ValueError(
        fmt::format("[demo] {} digits are too few: a fifth are kept for testing, and "
                    "the rest must fill a batch of {}",
                    s[0], o.batch));
  for (int64_t v : labels.to_vector<int64_t>())
    if (v < 0 || v >= 10)
      throw ValueError(
          fmt::format("[demo] {}/digits_labels.npy holds the label {}; digits are "
                      "0 to 9",
                      o.data, v));
}

void run_demo(const DemoOptions& o) {
  const Device dev = o.device.empty() ? default_device() : Device::parse(o.device);
  const std::string images_path = o.data + "/digits_images.npy";
  if (!std::filesystem::exists(images_path))
    throw IoError(fmt::format("[demo] {} is missing: `make demo` writes it (scripts/digits.py)",
                              images_path));
  Array images = Array::load_npy(images_path);
  Array labels = Array::load_npy(o.data + "/digits_labels.npy");
  check_digits(images, labels, o);
  const int64_t n = images.shape()[0];

  // a fixed shuffle: 80% train, 20% test
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  const int64_t n_test = n / 5;
  std::vector<int64_t> test_idx(order.begin(), order.begin() + n_test);
  std::vector<int64_t> train_idx(order.begin() + n_test, order.end());
  Array test_x = images.take_rows(test_idx), test_y = labels.take_rows(test_idx);
  fmt::print("kiln {} demo: training a convnet on {} 8x8 digits ({} train, {} test) on {}{}\n",
             version(), n, train_idx.size(), n_test, dev.str(),
             o.autocast.empty() ? "" : " with autocast " + o.autocast);

  // --trace: the profiler sees the compiles and the first training steps
  std::optional<ProfileScope> profile;
  if (!o.trace.empty()) profile.emplace();
  auto t0 = clock_type::now();
  Graph g;
  Model model(g, 2026);
  // shapes are static: gradient rules then need no run-time shapes
  auto x = g.placeholder({o.batch, 1, 8, 8}, f32, "images");
  auto y = g.placeholder({o.batch}, i64, "labels");
  auto xe = g.placeholder({n_test, 1, 8, 8}, f32, "test_images");
  auto logits = model.logits(x);
  auto loss = softmax_cross_entropy(logits, y);
  const CompileOptions copts{.autocast = low_precision(o.autocast)};
  auto train = g.compile(dev, {}, {loss}, training_step(g, loss, model.params(), o), copts);
  auto eval = g.compile(dev, {}, {argmax(model.logits(xe), -1)}, copts);
  fmt::print("built and compiled training ({} kernels) and evaluation ({} kernels) in {:.1f} ms\n",
             train.num_steps(), eval.num_steps(), ms_since(t0));
  for (const Executable* e : {&train, &eval})
    for (auto& s : e->placement())
      if (!s.fallback_reason.empty())
        fmt::print("  cpu fallback: %{} {} ({})\n", s.node, s.op, s.fallback_reason);

  std::mt19937 rng(11);
  const int64_t steps_per_epoch = static_cast<int64_t>(train_idx.size()) / o.batch;
  double step_ms = 0;
  int64_t steps = 0;
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    std::shuffle(train_idx.begin(), train_idx.end(), rng);
    double total = 0;
    for (int64_t s = 0; s < steps_per_epoch; ++s) {
      std::vector<int64_t> idx(train_idx.begin() + s * o.batch, train_idx.begin() + (s + 1) * o.batch);
      Array bx = images.take_rows(idx), by = labels.take_rows(idx);
      auto ts = clock_type::now();
      total += train.run({{x, bx}, {y, by}})[0].to_vector<double>()[0];
      step_ms += ms_since(ts);
      ++steps;
      if (profile && steps == kTracedSteps) {
        const Profile p = profile->stop();
        profile.reset();
        p.save(o.trace);
        fmt::print("wrote the profile of compiling and {} training steps to {} ({} spans)\n",
                   kTracedSteps, o.trace, p.spans.size());
      }
    }
    fmt::print("epoch {:2d}: loss {:.4f}, test accuracy {:.1f}%\n", epoch,
               total / static_cast<double>(steps_per_epoch), accuracy(eval, xe, test_x, test_y));
  }
  const double acc = accuracy(eval, xe, test_x, test_y);
  fmt::print("trained {} steps of batch {} in {:.2f} s: {:.3f} ms per step on {}\n", steps,
             o.batch, ms_since(t0) / 1e3, step_ms / static_cast<double>(steps), dev.str());

  // save, reload into a fresh graph, check the accuracy is the same
  std::filesystem::create_directories(std::filesystem::path(o.checkpoint).parent_path().empty()
                                          ? "."
                                          : std::filesystem::path(o.checkpoint).parent_path());
  g.save_variables(o.checkpoint);
  Graph fresh;
  Model reloaded(fresh, 1);  // other random weights, replaced by the checkpoint
  auto fx = fresh.placeholder({n_test, 1, 8, 8}, f32, "test_images");
  auto fpred = argmax(reloaded.logits(fx), -1);
  fresh.load_variables(o.checkpoint);
  auto fresh_eval = fresh.compile(dev, {}, {fpred}, copts);
  const double acc2 = accuracy(fresh_eval, fx, test_x, test_y);
  fmt::print("saved the variables to {} and reloaded them: test accuracy {:.1f}% (was {:.1f}%)\n",
             o.checkpoint, acc2, acc);
  if (acc2 != acc) throw Error("[demo] the reloaded model does not match the trained one");
  fmt::print("demo done: test accuracy {:.1f}%\n", acc);
}
}  // namespace

void add_demo_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("demo", "Train a small convnet on the digits dataset");
  static DemoOptions opts;
  cmd->add_option("--data", opts.data, "Folder with digits_images.npy and digits_labels.npy");
  cmd->add_option("--epochs", opts.epochs, "Training epochs")->check(CLI::Range(1, 1000));
  cmd->add_option("--batch", opts.batch, "Batch size")->check(CLI::Range(1, 1024));
  cmd->add_option("--lr", opts.lr, "Learning rate (SGD with momentum 0.9)");
  cmd->add_option("--checkpoint", opts.checkpoint, "Where to save the trained variables");
  cmd->add_option("--device", opts.device, "cpu, cuda or cuda:N (default: the first GPU, else cpu)");
  cmd->add_option("--trace", opts.trace,
                  "Profile compiling and the first training steps; write the Chrome trace here "
                  "(or the HTML report for a path ending in .html)");
  cmd->add_option("--autocast", opts.autocast,
                  "Mixed precision: bf16, or f16 with dynamic loss scaling")
      ->check(CLI::IsMember({"bf16", "f16"}));
  cmd->callback([] { run_demo(opts); });
}

}  // namespace kiln::cli
