// Post-training int8 quantization (include/kiln/quantize.h) of ResNet-50 (bench/resnet50.h) and
// a BERT-base-shaped encoder: package sizes, agreement with the float model, and inference time
// of int8 beside f32 and bf16 (autocast) in one process.
//
//   kiln_bench_quant [--device cpu|cuda] [--method minmax|percentile|entropy] [--images 1000]
//                    [--calib-batches 4] [--batch 8] [--image-size 224] [--seq 128] [--reps 5]
//                    [--model all|resnet|bert] [--quick]
//
// ResNet-50 has random weights, so its 1000 logits are near ties and raw top-1 agreement says
// little; the benchmark also classifies images of 10 kinds (a random prototype each, plus noise)
// by the nearest class centroid of the float model's logits, the agreement a decisive classifier
// sees. --quick runs small shapes in seconds (a smoke test). KILN_BENCH_DUMP=1 prints the int8
// executables' steps.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>

#include "bench/resnet50.h"
#include "bench/timing.h"
#include "kiln/quantize.h"

namespace {
using namespace kiln;
using kiln::bench::median_ms;

struct Args {
  std::string device = "cpu";
  CalibrationMethod method = CalibrationMethod::percentile;
  int64_t images = 1000, calib_batches = 4, batch = 8, image_size = 224, seq = 128;
  int reps = 5;
  std::string model = "all";
  bool quick = false;
  // BERT-base
  int64_t hidden = 768, heads = 12, ffn = 3072, layers = 12;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

uintmax_t package_bytes(const Executable& exe, const std::string& tag) {
  const auto path = std::filesystem::temp_directory_path() / ("kiln_bench_quant_" + tag + ".kiln");
  exe.save(path.string());
  const uintmax_t n = std::filesystem::file_size(path);
  std::filesystem::remove(path);
  return n;
}

std::vector<double> host(const Array& a) {
  return a.to(Device::cpu()).astype(f64).to_vector<double>();
}

double cosine(const std::vector<double>& a, const std::vector<double>& b) {
  double dot = 0, na = 0, nb = 0;
  for (size_t i = 0; i < a.size(); ++i) dot += a[i] * b[i], na += a[i] * a[i], nb += b[i] * b[i];
  return dot / std::sqrt(na * nb);
}

std::vector<int64_t> argmax_rows(const std::vector<double>& v, int64_t cols) {
  std::vector<int64_t> r;
  for (size_t i = 0; i < v.size(); i += static_cast<size_t>(cols))
    r.push_back(std::max_element(v.begin() + static_cast<long>(i),
                                 v.begin() + static_cast<long>(i) + cols) -
                (v.begin() + static_cast<long>(i)));
  return r;
}

int count_steps(const Executable& exe, const std::string& op) {
  int n = 0;
  for (const auto& s : exe.placement()) n += s.op == op;
  return n;
}

// f32, bf16 (autocast) and int8 executables of one model, timed side by side.
void time_three(const std::string& what, const Graph& g, const Tensor& x, const Tensor& y,
                const QuantizedGraph& q, const Shape& shape, const Array& input, Device device,
                int reps) {
  CompileOptions bf;
  bf.autocast = bf16;
  const Executable f32x = g.compile(device, {{x, shape}}, {y});
  const Executable bf16x = g.compile(device, {{x, shape}}, {y}, bf);
  const Executable i8x = q.graph.compile(device, {{q.inputs[0], shape}}, q.outputs);
  if (std::getenv("KILN_BENCH_DUMP")) fmt::print("{}\n", i8x.dump());
  const Array in = input.to(device);
  auto timed = [&](const Executable& e, const Tensor& t) {
    return median_ms([&] { e.run({{t, in}})[0].to(Device::cpu()); }, reps);
  };
  const double tf = timed(f32x, x), tb = timed(bf16x, x), ti = timed(i8x, q.inputs[0]);
  fmt::print(
      "{} inference, batch {}, {}: f32 {:.3f} ms, bf16 {:.3f} ms ({:.2f}x f32), int8 {:.3f} "
      "ms ({:.2f}x f32, {:.2f}x bf16)\n",
      what, shape[0], device.str(), tf, tb, tf / tb, ti, tf / ti, tb / ti);
  fmt::print(
      "  int8 kernels: {} quantized_conv, {} quantized_matmul; float conv {}, matmul {}, "
      "linear {}\n",
      count_steps(i8x, "quantized_conv"), count_steps(i8x, "quantized_matmul"),
      count_steps(i8x, "conv"), count_steps(i8x, "matmul"), count_steps(i8x, "linear"));
}

void report_sizes(const std::string& what, const Executable& f, const Executable& q) {
  const uintmax_t fb = package_bytes(f, "f32"), qb = package_bytes(q, "int8");
  fmt::print("{} package: f32 {:.2f} MiB, int8 {:.2f} MiB ({:.3f}x)\n", what, fb / 1048576.0,
             qb / 1048576.0, static_cast<double>(qb) / static_cast<double>(fb));
}

void resnet(const Args& a, Device device) {
  using kiln_bench::ResNet50;
  using kiln_bench::Rng;
  fmt::print("== ResNet-50, {}x{} images, {} calibration batches of {}\n", a.image_size,
             a.image_size, a.calib_batches, a.batch);
  Graph g;
  const Tensor x = g.placeholder({-1, 3, a.image_size, a.image_size}, f32, "images");
  ResNet50 net(g, false, 1);
  const Tensor logits = net.forward(x);
  const Shape bs{a.batch, 3, a.image_size, a.image_size};
  Rng rng(7);
  // 10 kinds of image: a prototype each (per-channel offsets and a pixel pattern), plus noise
  constexpr int64_t kKinds = 10;
  const int64_t pixels = 3 * a.image_size * a.image_size;
  const Array protos = rng.array({kKinds, 3, a.image_size, a.image_size}, 0.5f);
  std::vector<float> offsets(kKinds * 3);
  for (float& o : offsets) o = 1.5f * rng.uniform() * 1.7320508f;
  std::mt19937_64 pick(11);
  auto images = [&](int64_t n, std::vector<int64_t>* kinds) {
    Array im = rng.array({n, 3, a.image_size, a.image_size}, 0.5f);
    float* p = im.data<float>();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k = static_cast<int64_t>(pick() % kKinds);
      if (kinds) kinds->push_back(k);
      for (int64_t j = 0; j < pixels; ++j)
        p[i * pixels + j] +=
            protos.data<float>()[k * pixels + j] +
            offsets[static_cast<size_t>(k * 3 + j / (a.image_size * a.image_size))];
    }
    return im;
  };
  std::vector<Feeds> calib;
  for (int64_t b = 0; b < a.calib_batches; ++b) calib.push_back({{x, images(a.batch, nullptr)}});
  PtqOptions o;
  o.method = a.method;
  o.device = device;
  auto t0 = std::chrono::steady_clock::now();
  const QuantizedGraph q = post_training_quantize(g, {logits}, calib, o);
  fmt::print(
      "quantized ({}) in {:.1f} s: {} ops int8, {} float; weights {:.1f} MiB f32 -> {:.1f} "
      "MiB int8\n",
      calibration_method_name(a.method), seconds_since(t0), q.report.quantized(),
      q.report.skipped(), q.report.weight_bytes_f32 / 1048576.0,
      q.report.weight_bytes_int8 / 1048576.0);

  const Executable fx = g.compile(device, {{x, bs}}, {logits});
  const Executable qx = q.graph.compile(device, {{q.inputs[0], bs}}, q.outputs);
  report_sizes("ResNet-50", fx, qx);
  // class centroids of the float logits, from 4 images of each kind
  std::vector<double> centroid(kKinds * 1000, 0.0);
  std::vector<int64_t> count(kKinds, 0);
  for (int64_t b = 0; b < std::max<int64_t>(1, 4 * kKinds / a.batch); ++b) {
    std::vector<int64_t> kinds;
    const auto y = host(fx.run({{x, images(a.batch, &kinds)}})[0]);
    for (size_t i = 0; i < kinds.size(); ++i) {
      ++count[static_cast<size_t>(kinds[i])];
      for (int64_t c = 0; c < 1000; ++c)
        centroid[static_cast<size_t>(kinds[i] * 1000 + c)] += y[i * 1000 + static_cast<size_t>(c)];
    }
  }
  for (int64_t k = 0; k < kKinds; ++k)
    for (int64_t c = 0; c < 1000; ++c)
      centroid[static_cast<size_t>(k * 1000 + c)] /=
          static_cast<double>(std::max<int64_t>(count[static_cast<size_t>(k)], 1));
  auto nearest = [&](const std::vector<double>& y, size_t row) {
    int64_t best = 0;
    double bd = 1e300;
    for (int64_t k = 0; k < kKinds; ++k) {
      double d = 0;
      for (int64_t c = 0; c < 1000; ++c) {
        const double e =
            y[row * 1000 + static_cast<size_t>(c)] - centroid[static_cast<size_t>(k * 1000 + c)];
        d += e * e;
      }
      if (d < bd) bd = d, best = k;
    }
    return best;
  };
  t0 = std::chrono::steady_clock::now();
  int64_t raw = 0, decisive = 0, n = 0;
  std::vector<double> fall, qall;
  for (int64_t done = 0; done < a.images; done += a.batch) {
    const Array im = images(a.batch, nullptr);
    const auto fy = host(fx.run({{x, im}})[0]), qy = host(qx.run({{q.inputs[0], im}})[0]);
    const auto fa = argmax_rows(fy, 1000), qa = argmax_rows(qy, 1000);
    for (size_t i = 0; i < fa.size(); ++i) {
      raw += fa[i] == qa[i];
      decisive += nearest(fy, i) == nearest(qy, i);
      ++n;
    }
    fall.insert(fall.end(), fy.begin(), fy.end());
    qall.insert(qall.end(), qy.begin(), qy.end());
  }
  fmt::print(
      "agreement on {} images ({:.0f} s): 1000-way top-1 {:.2f}%, nearest-centroid top-1 "
      "{:.2f}%, logits cosine {:.5f}\n",
      n, seconds_since(t0), 100.0 * raw / n, 100.0 * decisive / n, cosine(fall, qall));
  time_three("ResNet-50", g, x, logits, q, bs, images(a.batch, nullptr), device, a.reps);
}

// BERT-base-shaped: post-norm layers of self-attention and a GELU feed-forward.
struct Encoder {
  Graph g;
  Tensor x, y;
  Encoder(const Args& a, int64_t batch) {
    kiln_bench::Rng rng(3);
    x = g.placeholder({batch, a.seq, a.hidden}, f32, "hidden");
    const int64_t dh = a.hidden / a.heads;
    auto dense = [&](const Tensor& in, int64_t fin, int64_t fout) {
      return linear(in, g.constant(rng.array({fout, fin}, 1.0f / std::sqrt(float(fin)))),
                    g.constant(rng.array({fout}, 0.02f)));
    };
    auto norm = [&](const Tensor& in) {
      return layer_norm(in, g.constant(rng.array({a.hidden}, 0.05f, 1.0f)),
                        g.constant(rng.array({a.hidden}, 0.02f)));
    };
    auto heads = [&](const Tensor& t) {
      return permute(reshape(t, {batch, a.seq, a.heads, dh}), {0, 2, 1, 3});
    };
    Tensor h = x;
    for (int64_t l = 0; l < a.layers; ++l) {
      const Tensor q = heads(dense(h, a.hidden, a.hidden)), k = heads(dense(h, a.hidden, a.hidden)),
                   v = heads(dense(h, a.hidden, a.hidden));
      const Tensor p = softmax(matmul(q, permute(k, {0, 1, 3, 2})) * (1.0 / std::sqrt(double(dh))));
      const Tensor ctx = reshape(permute(matmul(p, v), {0, 2, 1, 3}), {batch, a.seq, a.hidden});
      const Tensor att = norm(dense(ctx, a.hidden, a.hidden) + h);
      h = norm(dense(gelu(dense(att, a.hidden, a.ffn)), a.ffn, a.hidden) + att);
    }
    y = h;
  }
};

void bert(const Args& a, Device device) {
  fmt::print(
      "== BERT-base-shaped encoder: {} layers, hidden {}, {} heads, FFN {}, seq {}, batch "
      "{}\n",
      a.layers, a.hidden, a.heads, a.ffn, a.seq, a.batch);
  Encoder m(a, a.batch);
  kiln_bench::Rng rng(5);
  const Shape s{a.batch, a.seq, a.hidden};
  std::vector<Feeds> calib;
  for (int64_t b = 0; b < a.calib_batches; ++b) calib.push_back({{m.x, rng.array(s, 1.0f)}});
  PtqOptions o;
  o.method = a.method;
  o.device = device;
  const auto t0 = std::chrono::steady_clock::now();
  const QuantizedGraph q = post_training_quantize(m.g, {m.y}, calib, o);
  fmt::print(
      "quantized ({}) in {:.1f} s: {} ops int8, {} float; weights {:.1f} MiB f32 -> {:.1f} "
      "MiB int8\n",
      calibration_method_name(a.method), seconds_since(t0), q.report.quantized(),
      q.report.skipped(), q.report.weight_bytes_f32 / 1048576.0,
      q.report.weight_bytes_int8 / 1048576.0);
  const Executable fx = m.g.compile(device, {}, {m.y});
  const Executable qx = q.graph.compile(device, {}, q.outputs);
  report_sizes("encoder", fx, qx);
  std::vector<double> fall, qall;
  for (int b = 0; b < 2; ++b) {
    const Array in = rng.array(s, 1.0f);
    const auto fy = host(fx.run({{m.x, in}})[0]), qy = host(qx.run({{q.inputs[0], in}})[0]);
    fall.insert(fall.end(), fy.begin(), fy.end());
    qall.insert(qall.end(), qy.begin(), qy.end());
  }
  fmt::print("encoder output cosine (int8 vs f32, {} sequences): {:.5f}\n", 2 * a.batch,
             cosine(fall, qall));
  time_three("encoder", m.g, m.x, m.y, q, s, rng.array(s, 1.0f), device, a.reps);
}
}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress shows when the output goes to a file
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--device")
      a.device = next();
    else if (k == "--method")
      a.method = parse_calibration_method(next());
    else if (k == "--images")
      a.images = std::stoll(next());
    else if (k == "--calib-batches")
      a.calib_batches = std::stoll(next());
    else if (k == "--batch")
      a.batch = std::stoll(next());
    else if (k == "--image-size")
      a.image_size = std::stoll(next());
    else if (k == "--seq")
      a.seq = std::stoll(next());
    else if (k == "--reps")
      a.reps = std::stoi(next());
    else if (k == "--model")
      a.model = next();
    else if (k == "--quick")
      a.quick = true;
    else {
      std::fprintf(stderr, "unknown option %s (see the header of bench/quant/bench_quant.cpp)\n",
                   k.c_str());
      return 2;
    }
  }
  if (a.model != "all" && a.model != "resnet" && a.model != "bert") {
    std::fprintf(stderr, "--model takes all, resnet or bert\n");
    return 2;
  }
  if (a.quick) {
    a.images = 16, a.calib_batches = 2, a.batch = 4, a.image_size = 32, a.seq = 16, a.reps = 2;
    a.hidden = 64, a.heads = 4, a.ffn = 256, a.layers = 2;
  }
  try {
    const Device device = Device::parse(a.device);
    fmt::print("kiln_bench_quant on {} (KILN_THREADS={})\n", device.str(),
               std::getenv("KILN_THREADS") ? std::getenv("KILN_THREADS") : "all cores");
    if (a.model != "bert") resnet(a, device);
    if (a.model != "resnet") bert(a, device);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
