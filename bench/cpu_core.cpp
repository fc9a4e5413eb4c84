// CPU core benchmark: kiln against its peers on the same shapes, in one process.
//   matmul and conv2d: kiln vs oneDNN called directly (same primitives a careful user would make)
//   elementwise add:   kiln vs memcpy bandwidth
// Prints one line per figure with the ratio; median of repeated runs.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <vector>

#include "kiln/kiln.h"

namespace {

using clock_type = std::chrono::steady_clock;

double median_ms(const std::function<void()>& f, int reps) {
  f();  // warm up
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto t0 = clock_type::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

kiln::Array random(const kiln::Shape& s) {
  static std::mt19937 g(42);
  std::uniform_real_distribution<float> d(-1, 1);
  kiln::Array a = kiln::Array::empty(s, kiln::f32);
  float* p = a.data<float>();
  for (int64_t i = 0; i < a.numel(); ++i) p[i] = d(g);
  return a;
}

void report(const char* what, double kiln_ms, const char* peer, double peer_ms, double work,
            const char* unit) {
  fmt::print("{:<44} kiln {:8.3f} ms ({:7.1f} {})  {:<14} {:8.3f} ms ({:7.1f} {})  ratio {:.2f}\n",
             what, kiln_ms, work / kiln_ms / 1e6, unit, peer, peer_ms, work / peer_ms / 1e6, unit,
             kiln_ms / peer_ms);
}

void bench_matmul(int64_t m, int64_t k, int64_t n, int reps) {
  using namespace dnnl;
  kiln::Array a = random({m, k}), b = random({k, n});
  kiln::Graph g;
  auto ta = g.placeholder({m, k}, kiln::f32, "a");
  auto tb = g.placeholder({k, n}, kiln::f32, "b");
  auto exe = g.compile(kiln::Device::cpu(), {}, {kiln::matmul(ta, tb)});
  const double kiln_ms = median_ms([&] { exe.run({{ta, a}, {tb, b}}); }, reps);

  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  memory::desc ad({m, k}, memory::data_type::f32, memory::format_tag::ab);
  memory::desc bd({k, n}, memory::data_type::f32, memory::format_tag::ab);
  memory::desc cd({m, n}, memory::data_type::f32, memory::format_tag::ab);
  matmul::primitive_desc pd(matmul::desc(ad, bd, cd), eng);
  matmul prim(pd);
  kiln::Array c = kiln::Array::empty({m, n}, kiln::f32);
  memory am(ad, eng, a.data()), bm(bd, eng, b.data()), cm(cd, eng, c.data());
  const double dnnl_ms = median_ms(
      [&] {
        prim.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
        s.wait();
      },
      reps);
  report(fmt::format("matmul {}x{}x{} f32", m, k, n).c_str(), kiln_ms, "oneDNN", dnnl_ms,
         2.0 * m * k * n / 1e3, "GFLOP/s");
}

void bench_conv(int64_t n, int64_t c, int64_t h, int64_t o, int64_t kh, int reps) {
  using namespace dnnl;
  kiln::Array x = random({n, c, h, h}), w = random({o, c, kh, kh}), bias = random({o});
  kiln::Graph g;
  auto tx = g.placeholder({n, c, h, h}, kiln::f32, "x");
  auto tw = g.constant(w);
  auto tb = g.constant(bias);
  kiln::ConvOptions opts;
  opts.padding = {kh / 2, kh / 2};
  auto exe = g.compile(kiln::Device::cpu(), {}, {kiln::conv2d(tx, tw, tb, opts)});
  const double kiln_ms = median_ms([&] { exe.run({{tx, x}}); }, reps);

  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  memory::desc xd({n, c, h, h}, memory::data_type::f32, memory::format_tag::nchw);
  memory::desc wd_any({o, c, kh, kh}, memory::data_type::f32, memory::format_tag::any);
  memory::desc bd({o}, memory::data_type::f32, memory::format_tag::a);
  memory::desc yd({n, o, h, h}, memory::data_type::f32, memory::format_tag::nchw);
  convolution_forward::desc d(prop_kind::forward_inference, algorithm::convolution_direct, xd,
                              wd_any, bd, yd, {1, 1}, {0, 0}, {kh / 2, kh / 2}, {kh / 2, kh / 2});
  convolution_forward::primitive_desc pd(d, eng);
  convolution_forward prim(pd);
  // the weights are reordered once, outside the timed loop, as a careful user would
  memory wuser({{o, c, kh, kh}, memory::data_type::f32, memory::format_tag::oihw}, eng, w.data());
  memory wm(pd.weights_desc(), eng);
  reorder(wuser, wm).execute(s, wuser, wm);
  kiln::Array y = kiln::Array::empty({n, o, h, h}, kiln::f32);
  memory xm(xd, eng, x.data()), bm(bd, eng, bias.data()), ym(yd, eng, y.data());
  const double dnnl_ms = median_ms(
      [&] {
        prim.execute(s, {{DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_BIAS, bm},
                         {DNNL_ARG_DST, ym}});
        s.wait();
      },
      reps);
  report(fmt::format("conv2d {}x{}x{}x{} -> {} k{} f32", n, c, h, h, o, kh).c_str(), kiln_ms,
         "oneDNN", dnnl_ms, 2.0 * n * o * h * h * c * kh * kh / 1e3, "GFLOP/s");
}

void bench_add(int64_t count, int reps) {
  kiln::Array a = random({count}), b = random({count});
  kiln::Graph g;
  auto ta = g.placeholder({count}, kiln::f32, "a");
  auto tb = g.placeholder({count}, kiln::f32, "b");
  auto exe = g.compile(kiln::Device::cpu(), {}, {ta + tb});
  const double kiln_ms = median_ms([&] { exe.run({{ta, a}, {tb, b}}); }, reps);
  std::vector<char> src(count * 4 * 2, 1), dst(count * 4 * 2);
  // memcpy of the same total traffic: add reads 2 arrays and writes 1 (3 x 4 bytes per element);
  // a copy of 8 bytes per element reads 8 and writes 8: scale to bytes moved
  const double copy_ms = median_ms([&] { std::memcpy(dst.data(), src.data(), src.size()); }, reps);
  const double add_bytes = 12.0 * count, copy_bytes = 16.0 * count;
  fmt::print("{:<44} kiln {:8.3f} ms ({:7.1f} GB/s)  memcpy         {:8.3f} ms ({:7.1f} GB/s)  "
             "bandwidth ratio {:.2f}\n",
             fmt::format("add {}M f32 (12 B/elem)", count >> 20), kiln_ms,
             add_bytes / kiln_ms / 1e6, copy_ms, copy_bytes / copy_ms / 1e6,
             (add_bytes / kiln_ms) / (copy_bytes / copy_ms));
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int reps = quick ? 3 : 20;
  fmt::print("kiln {} CPU benchmark (median of {} runs)\n", kiln::version(), reps);
  bench_matmul(1024, 1024, 1024, reps);
  bench_matmul(256, 512, 128, reps);
  bench_conv(8, 64, 56, 64, 3, reps);
  bench_conv(1, 3, 224, 32, 3, reps);
  bench_add(int64_t{16} << 20, reps);
  return 0;
}
