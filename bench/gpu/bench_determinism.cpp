// The cost of CompileOptions::deterministic: training steps of the models of
// bench/gpu/determinism_nets.h (a ResNet-shaped CNN, a BERT-tiny-shaped encoder, an LSTM), at the
// benchmark's sizes, compiled with the mode off and on, each timed as the median wall time of
// Executable::run (which synchronizes once at its end) after warm-up runs, with the batches
// already on the device. Prints a table (workload, ms off, ms on, ratio) and one
// machine-readable line per workload:
//   kiln determinism <workload> <ms off> <ms on>
// Usage: kiln_bench_determinism [--reps N] [--warmup N] [--small] [--only name,...]
//        [--device cuda:0|cpu]
// --small runs the test's sizes (a smoke test; --device cpu runs without a GPU).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include "bench/gpu/determinism_nets.h"
#include "bench/timing.h"
#include "kiln/kiln.h"

namespace {
using namespace kiln;
using namespace kiln_bench;

struct Options {
  Device device = Device::cuda(0);
  int reps = 30, warmup = 5;
  bool small = false;
  std::vector<std::string> only;
};

struct Row {
  std::string name;
  double off = 0, on = 0;
};

// Median ms of one training step of `t` compiled with `deterministic`.
double time_step(const TrainStep& t, bool deterministic, const Options& o) {
  CompileOptions c;
  c.deterministic = deterministic;
  Executable exe = t.compile(o.device, c);
  std::vector<Feeds> batches;
  for (const Feeds& f : t.batches) {
    Feeds on_device;
    for (const auto& [tensor, value] : f) on_device.emplace_back(tensor, value.to(o.device));
    batches.push_back(std::move(on_device));
  }
  size_t k = 0;
  const auto step = [&] { exe.run(batches[k++ % batches.size()]); };
  for (int i = 1; i < o.warmup; ++i) step();  // (median_ms runs one more first)
  return bench::median_ms(step, o.reps);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IONBF, 0);  // a hung device call must not swallow the output
  Options o;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw ValueError("[bench] " + a + " needs a value");
        return argv[++i];
      };
      if (a == "--reps") o.reps = std::stoi(value());
      else if (a == "--warmup") o.warmup = std::stoi(value());
      else if (a == "--small") o.small = true;
      else if (a == "--device") o.device = Device::parse(value());
      else if (a == "--only") {
        std::stringstream ss(value());
        for (std::string s; std::getline(ss, s, ',');)
          if (!s.empty()) o.only.push_back(s);
      } else {
        throw ValueError("[bench] unknown argument " + a);
      }
    }
  } catch (const std::exception& e) {
    fmt::print(stderr,
               "{}\nusage: kiln_bench_determinism [--reps N] [--warmup N] [--small] "
               "[--only resnet_small,bert_tiny,lstm] [--device cuda:0|cpu]\n",
               e.what());
    return 2;
  }
  const NetSizes sizes = o.small ? NetSizes::small() : NetSizes::bench();
  fmt::print(
      "# kiln {} on {}: training steps with CompileOptions::deterministic off and on, median "
      "of {} runs after {} warm-up runs, wall clock around Executable::run (which "
      "synchronizes); batch {}\n",
      version(), o.device.str(), o.reps, o.warmup, sizes.batch);
  fmt::print("# resnet_small: {}x3x{}x{}, {} and {} channels; bert_tiny: seq {}, hidden {}, {} heads, "
             "MLP {}, {} layers, vocabulary {}; lstm: {} steps, input {}, hidden {}, 2 layers\n",
             sizes.batch, sizes.image, sizes.image, sizes.width, 2 * sizes.width, sizes.seq,
             sizes.hidden, sizes.heads, sizes.mlp, sizes.layers, sizes.vocab, sizes.steps,
             sizes.input, sizes.lstm_hidden);
  std::vector<Row> rows;
  int failed = 0;
  for (TrainStep (*build)(const NetSizes&, int) : {resnet_small, bert_tiny, lstm_model}) {
    // each mode gets its own graph, so both start from the same variables
    const TrainStep off = build(sizes, 4), on = build(sizes, 4);
    if (!o.only.empty() && std::find(o.only.begin(), o.only.end(), off.name) == o.only.end())
      continue;
    try {
      Row r{off.name, time_step(off, false, o), time_step(on, true, o)};
      fmt::print("kiln determinism {} {:.4f} {:.4f}\n", r.name, r.off, r.on);
      rows.push_back(r);
    } catch (const std::exception& e) {
      fmt::print("kiln determinism {} error {}\n", off.name, e.what());
      ++failed;
    }
  }
  fmt::print("\n| workload | ms off | ms on | ratio |\n|---|---|---|---|\n");
  for (const Row& r : rows)
    fmt::print("| {} | {:.3f} | {:.3f} | {:.2f} |\n", r.name, r.off, r.on, r.on / r.off);
  return failed == 0 ? 0 : 1;
}
