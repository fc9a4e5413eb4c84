// Package benchmark: starting an app from an ONNX model (import + compile + first run) against
// starting it from a package (load + first run), on a ResNet-50-sized model.
//
//   .venv/bin/python bench/package/make_resnet50_onnx.py resnet50.onnx
//   build/bench/package/kiln_bench_package resnet50.onnx [--device cpu|cuda] [--reps 5]
//
// Prints the median of `reps` cold starts of each path (the package file is in the page cache,
// as it is when an app starts again), the load time without the weights' checksums (the weights
// are memory-mapped and only read by the first run), and the ratios.
//
// On a GPU every start begins with no tuning decisions in the process, as a new process does:
// the compiled executable's first run measures the cuDNN convolution algorithms; the package,
// saved after a run, carries them, so its first run measures nothing. A package saved before any
// run (no tuning stored) shows what the stored tuning saves.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/device_backend.h"
#include "kiln/kiln.h"
#include "kiln/onnx.h"

namespace {
using namespace kiln;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Array input(const Shape& s) {
  Array a = Array::empty(s, f32);
  float* p = a.data<float>();
  for (int64_t i = 0; i < a.numel(); ++i)
    p[i] = static_cast<float>((i * 2654435761u) % 1000) / 500.0f - 1;
  return a;
}

bool same(const Array& a, const Array& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// A start as in a new process: no tuning decisions made and no generated kernel compiled or
// loaded yet (GPU backends).
void forget_tuning(Device device) {
  if (DeviceBackend* b = backend_of(device)) {
    b->clear_tuning();
    b->forget_kernels();
  }
}
int64_t kernels_compiled(Device device) {
  DeviceBackend* b = backend_of(device);
  return b ? b->kernels_compiled() : 0;
}
int64_t measured(Device device) {
  DeviceBackend* b = backend_of(device);
  return b ? b->tuning_stats().measured : 0;
}
}  // namespace

int main(int argc, char** argv) {
  std::string model_path;
  Device device = Device::cpu();
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--device" && i + 1 < argc)
      device = Device::parse(argv[++i]);
    else if (a == "--reps" && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
    else
      model_path = a;
  }
  if (model_path.empty()) {
    fmt::print(stderr, "usage: kiln_bench_package MODEL.onnx [--device cpu|cuda] [--reps N]\n");
    return 2;
  }
  const std::string package_path = model_path + ".kiln";
  const std::string untuned_path = model_path + ".untuned.kiln";
  const bool gpu = device.kind != Device::Kind::cpu;
  try {
    std::vector<double> t_import, t_compile, t_first, t_load, t_load_first, t_load_nocheck,
        t_untuned_first;
    int64_t compiled_measured = 0, loaded_measured = 0, untuned_measured = 0;
    int64_t compile_compiled = 0, loaded_compiled = 0;  // generated kernels compiled
    Array x, want;
    std::string input_name;
    for (int r = 0; r < reps; ++r) {
      forget_tuning(device);
      const int64_t k0 = kernels_compiled(device);
      auto t0 = Clock::now();
      onnx::Model m = onnx::import(model_path);
      t_import.push_back(ms_since(t0));
      t0 = Clock::now();
      Executable exe = m.graph.compile(device, m.feed_shapes(), m.output_tensors());
      t_compile.push_back(ms_since(t0));
      if (r == 0) {
        input_name = exe.inputs().at(0).name;
        x = input(exe.inputs().at(0).shape);
        if (gpu) exe.save(untuned_path);  // before any run: no tuning to store
      }
      const int64_t m0 = measured(device);
      t0 = Clock::now();
      Array y = exe.run(std::map<std::string, Array>{{input_name, x}})[0].to(Device::cpu());
      t_first.push_back(ms_since(t0));
      compiled_measured = measured(device) - m0;
      compile_compiled = kernels_compiled(device) - k0;
      if (r == 0) {
        want = y;
        t0 = Clock::now();
        exe.save(package_path, {.producer = "kiln_bench_package"});
        fmt::print("# save: {:.1f} ms, {:.1f} MB; {} steps\n", ms_since(t0),
                   static_cast<double>(std::filesystem::file_size(package_path)) / 1e6,
                   exe.num_steps());
      }
    }
    for (int r = 0; r < reps; ++r) {
      forget_tuning(device);
      const int64_t m0 = measured(device), k0 = kernels_compiled(device);
      auto t0 = Clock::now();
      Executable exe = Executable::load(package_path, device);
      t_load.push_back(ms_since(t0));
      t0 = Clock::now();
      Array y = exe.run(std::map<std::string, Array>{{input_name, x}})[0].to(Device::cpu());
      t_load_first.push_back(ms_since(t0));
      loaded_measured = measured(device) - m0;
      loaded_compiled = kernels_compiled(device) - k0;
      if (!same(y, want)) {
        fmt::print(stderr, "the loaded executable's output differs from the compiled one's\n");
        return 1;
      }
      t0 = Clock::now();
      Executable fast = Executable::load(package_path, device, {.verify_weights = false});
      t_load_nocheck.push_back(ms_since(t0));
      if (gpu) {
        forget_tuning(device);
        const int64_t m1 = measured(device);
        Executable untuned = Executable::load(untuned_path, device);
        t0 = Clock::now();
        untuned.run(std::map<std::string, Array>{{input_name, x}})[0].to(Device::cpu());
        t_untuned_first.push_back(ms_since(t0));
        untuned_measured = measured(device) - m1;
      }
    }
    const double imp = median(t_import), comp = median(t_compile), first = median(t_first);
    const double load = median(t_load), lfirst = median(t_load_first),
                 nocheck = median(t_load_nocheck);
    const double cold = imp + comp + first, warm = load + lfirst;
    fmt::print("# {} on {}, median of {} starts\n", model_path, device.str(), reps);
    fmt::print("#   import {:.1f} ms + compile {:.1f} ms + first run {:.1f} ms = {:.1f} ms\n", imp,
               comp, first, cold);
    fmt::print("#   load {:.1f} ms + first run {:.1f} ms = {:.1f} ms\n", load, lfirst, warm);
    fmt::print("#   load without weight checksums: {:.2f} ms\n", nocheck);
    if (gpu) {
      fmt::print("#   cuDNN algorithms measured by a first run: compiled {}, loaded {}, loaded "
                 "without stored tuning {}\n",
                 compiled_measured, loaded_measured, untuned_measured);
      fmt::print("#   first run of a package without stored tuning: {:.1f} ms\n",
                 median(t_untuned_first));
      fmt::print("#   generated kernels compiled: by import + compile {}, by load + first run {}\n",
                 compile_compiled, loaded_compiled);
    }
    fmt::print(
        "#   start from the package is {:.1f}x faster (startup before the first run: {:.1f}x)\n",
        cold / warm, (imp + comp) / load);
    fmt::print("kiln package_import_compile_first_run_ms {:.2f}\n", cold);
    fmt::print("kiln package_load_first_run_ms {:.2f}\n", warm);
    fmt::print("kiln package_load_ms {:.2f}\n", load);
    fmt::print("kiln package_load_no_weight_check_ms {:.3f}\n", nocheck);
    fmt::print("kiln package_speedup {:.2f}\n", cold / warm);
    if (gpu) {
      fmt::print("kiln package_untuned_first_run_ms {:.2f}\n", median(t_untuned_first));
      fmt::print("kiln package_first_run_measurements {}\n", loaded_measured);
      fmt::print("kiln package_load_kernels_compiled {}\n", loaded_compiled);
    }
  } catch (const Error& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
  std::filesystem::remove(package_path);
  std::filesystem::remove(untuned_path);
  return 0;
}
