// CPU core benchmark: kiln against its peers on the same shapes, in one process.
//   matmul and conv2d: kiln vs oneDNN called directly (same primitives a careful user would make)
//   attention:         kiln's fused kernel vs oneDNN's batched matmul, softmax and matmul (the
//                      scores formed in memory), f32 and bf16
//   elementwise add:   kiln vs memcpy bandwidth
// Prints one line per figure with the ratio; median of repeated runs.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <thread>
#include <vector>

#include "bench/timing.h"
#include "kiln/kiln.h"

namespace {

using kiln::bench::median_ms;

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
         2.0 * m * k * n, "GFLOP/s");
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
  const double flops = 2.0 * n * o * h * h * c * kh * kh;
  report(fmt::format("conv2d {}x{}x{}x{} -> {} k{} f32", n, c, h, h, o, kh).c_str(), kiln_ms,
         "oneDNN nchw", dnnl_ms, flops, "GFLOP/s");

  // oneDNN's ceiling: every tensor already in the layout the primitive prefers (a whole network
  // kept in blocked layouts), so no reorder is timed at all
  memory::desc x_any({n, c, h, h}, memory::data_type::f32, memory::format_tag::any);
  memory::desc y_any({n, o, h, h}, memory::data_type::f32, memory::format_tag::any);
  convolution_forward::desc db(prop_kind::forward_inference, algorithm::convolution_direct, x_any,
                               wd_any, bd, y_any, {1, 1}, {0, 0}, {kh / 2, kh / 2},
                               {kh / 2, kh / 2});
  convolution_forward::primitive_desc pdb(db, eng);
  convolution_forward primb(pdb);
  memory xb(pdb.src_desc(), eng), wb(pdb.weights_desc(), eng), yb(pdb.dst_desc(), eng);
  reorder(xm, xb).execute(s, xm, xb);
  reorder(wuser, wb).execute(s, wuser, wb);
  const double blocked_ms = median_ms(
      [&] {
        primb.execute(s, {{DNNL_ARG_SRC, xb}, {DNNL_ARG_WEIGHTS, wb}, {DNNL_ARG_BIAS, bm},
                          {DNNL_ARG_DST, yb}});
        s.wait();
      },
      reps);
  report(fmt::format("conv2d {}x{}x{}x{} -> {} k{} f32", n, c, h, h, o, kh).c_str(), kiln_ms,
         "oneDNN blocked", blocked_ms, flops, "GFLOP/s");
}

// softmax(q kᵀ / sqrt(e)) v over (batch, heads): kiln's scaled_dot_product_attention against the
// unfused composition a careful oneDNN user would write (both batched). f32, or bf16 operands
// (oneDNN: bf16 products into f32 scores, the softmax in f32, the weights rounded to bf16 for the
// second product) beside kiln's own f32 kernel on the same data.
void bench_attention(int64_t batch, int64_t heads, int64_t len, int64_t e, int reps,
                     kiln::DType t = kiln::f32) {
  using namespace dnnl;
  const kiln::Shape shape{batch, heads, len, e};
  kiln::Array q = random(shape), k = random(shape), v = random(shape);
  const auto kiln_run = [&](kiln::DType dt) {
    kiln::Graph g;
    auto tq = g.placeholder(shape, dt, "q");
    auto tk = g.placeholder(shape, dt, "k");
    auto tv = g.placeholder(shape, dt, "v");
    auto exe = g.compile(kiln::Device::cpu(), {}, {kiln::scaled_dot_product_attention(tq, tk, tv)});
    kiln::Array a = q.astype(dt), b = k.astype(dt), c = v.astype(dt);
    return median_ms([&] { exe.run({{tq, a}, {tk, b}, {tv, c}}); }, reps);
  };
  const double kiln_ms = kiln_run(t);
  const bool bf = t == kiln::bf16;

  const int64_t bh = batch * heads;
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  using dt = memory::data_type;
  using tag = memory::format_tag;
  const dt in = bf ? dt::bf16 : dt::f32;
  const memory::desc qd({bh, len, e}, in, tag::abc), kt({bh, e, len}, in, tag::acb),
      sd({bh, len, len}, dt::f32, tag::abc), wd({bh, len, len}, in, tag::abc),
      vd({bh, len, e}, in, tag::abc), od({bh, len, e}, in, tag::abc);
  primitive_attr scaled;
  scaled.set_output_scales(0, {1.0f / std::sqrt(static_cast<float>(e))});
  matmul scores(matmul::primitive_desc(matmul::desc(qd, kt, sd), scaled, eng));
  softmax_forward softmax(softmax_forward::primitive_desc(
      softmax_forward::desc(prop_kind::forward_inference, sd, 2), eng));
  reorder round(reorder::primitive_desc(eng, sd, eng, wd));
  matmul weigh(matmul::primitive_desc(matmul::desc(wd, vd, od), eng));
  kiln::Array sc = kiln::Array::empty({bh, len, len}, kiln::f32);
  kiln::Array w = kiln::Array::empty({bh, len, len}, t);
  kiln::Array out = kiln::Array::empty(shape, t);
  kiln::Array qt = q.astype(t), kt_ = k.astype(t), vt = v.astype(t);
  memory qm(qd, eng, qt.data()), km(kt, eng, kt_.data()), vm(vd, eng, vt.data()),
      sm(sd, eng, sc.data()), wm(wd, eng, bf ? w.data() : sc.data()), om(od, eng, out.data());
  const double dnnl_ms = median_ms(
      [&] {
        scores.execute(s, {{DNNL_ARG_SRC, qm}, {DNNL_ARG_WEIGHTS, km}, {DNNL_ARG_DST, sm}});
        softmax.execute(s, {{DNNL_ARG_SRC, sm}, {DNNL_ARG_DST, sm}});
        if (bf) round.execute(s, sm, wm);
        weigh.execute(s, {{DNNL_ARG_SRC, wm}, {DNNL_ARG_WEIGHTS, vm}, {DNNL_ARG_DST, om}});
        s.wait();
      },
      reps);
  const double flops = 4.0 * bh * len * len * e;
  const std::string what = fmt::format("attention {}x{} heads, {}x{}, e {} {}", batch, heads, len,
                                       len, e, kiln::name(t));
  report(what.c_str(), kiln_ms, "oneDNN mm+sm+mm", dnnl_ms, flops, "GFLOP/s");
  if (bf)
    report((what + " / kiln f32").c_str(), kiln_ms, "kiln f32", kiln_run(kiln::f32), flops,
           "GFLOP/s");
}

void bench_add(int64_t count, int reps) {
  kiln::Array a = random({count}), b = random({count});
  kiln::Graph g;
  auto ta = g.placeholder({count}, kiln::f32, "a");
  auto tb = g.placeholder({count}, kiln::f32, "b");
  auto exe = g.compile(kiln::Device::cpu(), {}, {ta + tb});
  const double kiln_ms = median_ms([&] { exe.run({{ta, a}, {tb, b}}); }, reps);
  // memcpy of 8 bytes per element (bytes moved: 8 read + 8 written); add moves 12 per element
  std::vector<char> src(count * 8, 1), dst(count * 8);
  const double copy_ms = median_ms([&] { std::memcpy(dst.data(), src.data(), src.size()); }, reps);
  // the same copy split over every hardware thread, as kiln's kernels are
  const int nt = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const double pcopy_ms = median_ms(
      [&] {
        std::vector<std::thread> ts;
        const size_t part = src.size() / nt;
        for (int t = 0; t < nt; ++t)
          ts.emplace_back([&, t] { std::memcpy(dst.data() + t * part, src.data() + t * part, part); });
        for (auto& t : ts) t.join();
      },
      reps);
  const double add_bytes = 12.0 * count, copy_bytes = 16.0 * count;
  const double best_copy = std::min(copy_ms, pcopy_ms);
  fmt::print("{:<44} kiln {:8.3f} ms ({:7.1f} GB/s)  memcpy {:8.3f} ms ({:6.1f} GB/s), on {} threads "
             "{:8.3f} ms ({:6.1f} GB/s)  bandwidth ratio {:.2f}\n",
             fmt::format("add {}M f32 (12 B/elem)", count >> 20), kiln_ms,
             add_bytes / kiln_ms / 1e6, copy_ms, copy_bytes / copy_ms / 1e6, nt, pcopy_ms,
             copy_bytes / pcopy_ms / 1e6, (add_bytes / kiln_ms) / (copy_bytes / best_copy));
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
  bench_attention(8, 12, 128, 64, reps);  // BERT-base at batch 8, sequence 128
  // bf16 (oneDNN's native bf16 products where the CPU has them): short and long sequences
  for (int64_t len : {128, 256, 512, 1024})
    bench_attention(len >= 512 ? 1 : 8, 12, len, 64, reps, kiln::bf16);
  bench_add(int64_t{16} << 20, reps);
  return 0;
}
