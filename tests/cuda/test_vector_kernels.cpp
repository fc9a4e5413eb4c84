// The vector paths of small CUDA kernels (quantize, dequantize and fake_quantize 4 elements a
// thread; the 1-byte short-q transpose 4 positions a thread; NHWC max pooling of 1-byte data
// without indices on 16-bit lanes; NHWC adaptive average pooling a thread per element when
// outputs are few), each run on shapes that take the path and on ones that just miss it (odd
// sizes, tails, misaligned buffers), against the CPU kernel or a host loop, bit for bit. Kernels
// are called directly on device buffers, so that offsets can misalign them. Skipped without a GPU.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "core/op_id.h"
#include "core/op_registry.h"
#include "kiln/kernel.h"
#include "support/gpu.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

// A buffer of `shape` on the GPU, `offset` elements past a 256-byte boundary.
class DeviceArray {
 public:
  DeviceArray(const Shape& shape, DType t, int64_t offset = 0) : shape_(shape), dtype_(t) {
    const size_t bytes = static_cast<size_t>(numel(shape) + offset) * size_of(t);
    KILN_CUDA_CHECK(cudaMalloc(&base_, bytes + 16));
    data_ = static_cast<char*>(base_) + offset * static_cast<int64_t>(size_of(t));
    KILN_CUDA_CHECK(cudaMemset(base_, 0xa5, bytes + 16));  // unwritten outputs show
  }
  DeviceArray(const Array& a, int64_t offset = 0) : DeviceArray(a.shape(), a.dtype(), offset) {
    KILN_CUDA_CHECK(cudaMemcpy(data_, a.data(), a.nbytes(), cudaMemcpyHostToDevice));
  }
  ~DeviceArray() { cudaFree(base_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  TensorView view() const { return {data_, shape_, dtype_}; }
  Array host() const {
    Array a = Array::empty(shape_, dtype_);
    KILN_CUDA_CHECK(cudaMemcpy(a.data(), data_, a.nbytes(), cudaMemcpyDeviceToHost));
    return a;
  }

 private:
  Shape shape_;
  DType dtype_;
  void* base_ = nullptr;
  char* data_ = nullptr;
};

TensorView view_of(Array& a) { return {a.data(), a.shape(), a.dtype()}; }

// Runs the kernel of `op` on `backend` for the layout `attrs` give (CUDA: on the default stream,
// then synchronized).
void run_kernel(OpId op, Backend backend, const Attrs& attrs, std::vector<TensorView> in,
                std::vector<TensorView> out) {
  const KernelEntry* k = find_kernel(op, backend, layout_of(op, attrs));
  ASSERT_NE(k, nullptr) << op_name(op) << " has no " << backend_name(backend) << " kernel";
  KernelEnv env;
  KernelContext ctx(op, attrs, std::move(in), std::move(out), nullptr,
                    backend == Backend::cuda ? &env : nullptr);
  k->fn(ctx);
  if (backend == Backend::cuda) KILN_CUDA_CHECK(cudaDeviceSynchronize());
}

// Expects the same bytes, naming the first element that differs.
void expect_same(const Array& got, const Array& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  const size_t es = size_of(got.dtype());
  const auto* g = static_cast<const unsigned char*>(got.data());
  const auto* w = static_cast<const unsigned char*>(want.data());
  for (int64_t i = 0; i < got.numel(); ++i)
    if (std::memcmp(g + i * es, w + i * es, es) != 0) {
      const auto gv = to_f64(got), wv = to_f64(want);
      ADD_FAILURE() << what << ": element " << i << " of " << got.numel() << " is " << gv[i]
                    << ", want " << wv[i];
      return;
    }
}

// ---- quantize, dequantize, fake_quantize

struct QuantCase {
  Shape x;
  int64_t axis, block;
  bool per_tensor;
  int64_t x_off, y_off;  // elements past an aligned start (1: the generic kernel)
};
const QuantCase kQuantCases[] = {
    {{4, 3, 224, 224}, 0, 0, true, 0, 0},  // the network input: vector path
    {{3, 5, 7, 11}, 0, 0, true, 0, 0},     // n % 4 == 3: a tail after the packs
    {{4097}, 0, 0, true, 0, 0},            // n % 4 == 1
    {{3}, 0, 0, true, 0, 0},               // no full pack
    {{1000, 2048}, 0, 0, false, 0, 0},     // per channel, inner 2048 (a linear weight)
    {{2, 16, 3, 4}, 1, 0, false, 0, 0},    // per channel, inner 12, outer 2
    {{6, 10}, 0, 0, false, 0, 0},          // inner 10: generic
    {{5, 6}, 1, 0, false, 0, 0},           // inner 1: generic
    {{8, 12}, 0, 3, false, 0, 0},          // per group (inner 12): generic
    {{4096}, 0, 0, true, 1, 0},            // misaligned input: generic
    {{4096}, 0, 0, true, 0, 1},            // misaligned output: generic
};

Shape scale_shape(const QuantCase& c) {
  if (c.per_tensor) return {};
  const size_t a = static_cast<size_t>(c.axis);
  if (c.block == 0) return {c.x[a]};
  Shape s = c.x;
  s[a] = (s[a] + c.block - 1) / c.block;
  return s;
}

std::string describe(const QuantCase& c, DType q) {
  return fmt::format("x {} axis {} block {} {} {} offsets {} {}", to_string(c.x), c.axis, c.block,
                     c.per_tensor ? "per tensor" : "per channel", name(q), c.x_off, c.y_off);
}

Array zero_points(const Shape& s, DType q) {
  return q == u8 ? random_array(s, u8, 100, 150) : random_array(s, i8, -20, 20);
}

// x spread to saturate, with NaN and infinities among the first elements.
Array quant_input(const Shape& shape) {
  Array x = random_array(shape, f32, -6, 6);
  float* v = x.data<float>();
  const float special[] = {std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(), 0.0f, -0.0f};
  for (int64_t i = 0; i < std::min<int64_t>(x.numel(), 5); ++i) v[i * 7 % x.numel()] = special[i];
  return x;
}

// op on the CPU and on CUDA over the same host inputs (x, scale, zp), outputs compared.
void check_quant_op(OpId op, const QuantCase& c, const Array& x, const Array& s, const Array& z,
                    DType out_dtype, const std::string& what) {
  const Attrs attrs{{"axis", c.axis}, {"block_size", c.block}};
  Array xs = x, ss = s, zs = z;
  Array want = Array::empty(c.x, out_dtype);
  run_kernel(op, Backend::cpu, attrs, {view_of(xs), view_of(ss), view_of(zs)}, {view_of(want)});
  const DeviceArray dx(x, c.x_off), ds(s), dz(z), dy(c.x, out_dtype, c.y_off);
  run_kernel(op, Backend::cuda, attrs, {dx.view(), ds.view(), dz.view()}, {dy.view()});
  expect_same(dy.host(), want, what);
}

TEST(CudaQuantize, VectorPathMatchesCpu) {
  REQUIRE_GPU();
  for (const QuantCase& c : kQuantCases)
    for (DType q : {u8, i8}) {
      const Shape ss = scale_shape(c);
      const Array x = quant_input(c.x), s = random_array(ss, f32, 0.01, 0.05),
                  z = zero_points(ss, q);
      check_quant_op(OpId::Quantize, c, x, s, z, q, "quantize " + describe(c, q));
      check_quant_op(OpId::FakeQuantize, c, x, s, z, f32, "fake_quantize " + describe(c, q));
    }
}

TEST(CudaDequantize, VectorPathMatchesCpu) {
  REQUIRE_GPU();
  for (const QuantCase& c : kQuantCases)
    for (DType q : {u8, i8}) {
      const Shape ss = scale_shape(c);
      const Array x = q == u8 ? random_array(c.x, u8, 0, 255) : random_array(c.x, i8, -128, 127);
      const Array s = random_array(ss, f32, 0.01, 0.05), z = zero_points(ss, q);
      check_quant_op(OpId::Dequantize, c, x, s, z, f32, "dequantize " + describe(c, q));
    }
}

// ---- transpose

// x permuted by perm, element by element on the host.
Array ref_transpose(const Array& x, const std::vector<int64_t>& perm) {
  const Shape& in = x.shape();
  const size_t rank = in.size(), es = size_of(x.dtype());
  Shape out(rank);
  for (size_t d = 0; d < rank; ++d) out[d] = in[static_cast<size_t>(perm[d])];
  const auto in_strides = contiguous_strides(in);
  Array y = Array::empty(out, x.dtype());
  const auto* src = static_cast<const unsigned char*>(x.data());
  auto* dst = static_cast<unsigned char*>(y.data());
  for (int64_t o = 0; o < y.numel(); ++o) {
    int64_t rem = o, off = 0;
    for (size_t d = rank; d-- > 0;) {
      off += rem % out[d] * in_strides[static_cast<size_t>(perm[d])];
      rem /= out[d];
    }
    std::memcpy(dst + o * es, src + off * es, es);
  }
  return y;
}

TEST(CudaTranspose, ShortQBytesMatchReference) {
  REQUIRE_GPU();
  struct TransposeCase {
    Shape x;
    std::vector<int64_t> perm;
    DType t;
    int64_t off;
  };
  std::vector<TransposeCase> cases = {
      {{4, 3, 224, 224}, {0, 2, 3, 1}, u8, 0},  // NCHW -> NHWC images: 4 positions a thread
      {{2, 4, 6, 8}, {1, 2, 3, 0}, u8, 0},      // no batch dims (p merged from three)
      {{2, 3, 5, 8}, {2, 0, 3, 1}, i8, 0},      // two batch dims in swapped order
      {{2, 3, 5, 7}, {0, 2, 3, 1}, u8, 0},      // np = 35: generic
      {{2, 3, 16, 16}, {0, 2, 3, 1}, u8, 1},    // misaligned: generic
      {{3, 4, 8}, {2, 1, 0}, u8, 0},            // q not right after p: generic
      {{2, 3, 16, 16}, {0, 2, 3, 1}, f16, 0},   // 2-byte elements: generic
  };
  for (int64_t nq = 2; nq <= 9; ++nq) cases.push_back({{2, nq, 8, 12}, {0, 2, 3, 1}, i8, 0});
  for (const TransposeCase& c : cases) {
    const std::string what = fmt::format("transpose {} {} perm [{}] offset {}", to_string(c.x),
                                         name(c.t), fmt::join(c.perm, ","), c.off);
    const Array x = c.t == f16
                        ? random_array(c.x, f16)
                        : random_array(c.x, c.t, c.t == u8 ? 0 : -128, c.t == u8 ? 255 : 127);
    const Array want = ref_transpose(x, c.perm);
    const DeviceArray dx(x, c.off), dy(want.shape(), c.t, c.off);
    run_kernel(OpId::Transpose, Backend::cuda, Attrs{{"perm", c.perm}}, {dx.view()}, {dy.view()});
    expect_same(dy.host(), want, what);
  }
}

// ---- max pooling, NHWC

struct PoolCase {
  Shape x;  // NHWC
  std::vector<int64_t> k, s, pads, dil;
  int64_t off;
};

Shape pool_out(const PoolCase& c) {
  Shape y = c.x;
  for (size_t d = 0; d < 2; ++d)
    y[1 + d] = (c.x[1 + d] + c.pads[d] + c.pads[2 + d] - c.dil[d] * (c.k[d] - 1) - 1) / c.s[d] + 1;
  return y;
}

// Values and in-plane indices on the host: taps in index order, the first maximum wins; an
// empty window gives T's lowest value and index -1.
template <typename T>
void ref_max_pool(const PoolCase& c, const Array& x, Array& y, Array& idx) {
  const int64_t H = c.x[1], W = c.x[2], C = c.x[3];
  const Shape ys = pool_out(c);
  const T* xv = x.data<T>();
  T* yv = y.data<T>();
  int64_t* iv = idx.data<int64_t>();
  for (int64_t n = 0; n < ys[0]; ++n)
    for (int64_t oh = 0; oh < ys[1]; ++oh)
      for (int64_t ow = 0; ow < ys[2]; ++ow)
        for (int64_t ch = 0; ch < C; ++ch) {
          T best = std::numeric_limits<T>::lowest();
          int64_t where = -1;
          for (int64_t a = 0; a < c.k[0]; ++a)
            for (int64_t b = 0; b < c.k[1]; ++b) {
              const int64_t h = oh * c.s[0] - c.pads[0] + a * c.dil[0];
              const int64_t w = ow * c.s[1] - c.pads[1] + b * c.dil[1];
              if (h < 0 || h >= H || w < 0 || w >= W) continue;
              const T v = xv[((n * H + h) * W + w) * C + ch];
              if (where < 0 || v > best) best = v, where = h * W + w;
            }
          const int64_t o = ((n * ys[1] + oh) * ys[2] + ow) * C + ch;
          yv[o] = best;
          iv[o] = where;
        }
}

TEST(CudaMaxPool, NhwcBytesMatchReference) {
  REQUIRE_GPU();
  const PoolCase cases[] = {
      {{4, 112, 112, 64}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 0},  // the ResNet stem pool
      {{2, 17, 18, 16}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 0},
      {{2, 9, 10, 48}, {2, 3}, {1, 2}, {0, 1, 1, 0}, {2, 1}, 0},  // dilated, asymmetric
      {{1, 5, 6, 32}, {2, 2}, {1, 1}, {2, 2, 2, 2}, {1, 1}, 0},   // empty corner windows
      {{1, 5, 6, 16}, {3, 3}, {1, 1}, {3, 3, 3, 3}, {1, 1}, 0},   // 3x3 (unrolled), empty too
      {{2, 11, 9, 16}, {3, 3}, {2, 1}, {2, 0, 1, 2}, {2, 1}, 0},  // 3x3 dilated, asymmetric
      {{2, 9, 9, 24}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 0},   // C % 16 != 0: generic
      {{2, 9, 9, 32}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 8},   // misaligned: generic
  };
  for (const PoolCase& c : cases)
    for (DType t : {u8, i8}) {
      const std::string what = fmt::format("max_pool x {} {} k {} s {} pads {} dil {} offset {}",
                                           to_string(c.x), name(t), to_string(c.k), to_string(c.s),
                                           to_string(c.pads), to_string(c.dil), c.off);
      // few distinct values, so that windows hold ties
      const Array x = t == u8 ? random_array(c.x, u8, 0, 40) : random_array(c.x, i8, -128, -90);
      const Shape ys = pool_out(c);
      Array want = Array::empty(ys, t), want_idx = Array::empty(ys, i64);
      if (t == u8)
        ref_max_pool<uint8_t>(c, x, want, want_idx);
      else
        ref_max_pool<int8_t>(c, x, want, want_idx);
      for (bool indices : {false, true}) {
        SCOPED_TRACE(indices ? "with indices" : "no_indices");
        Attrs attrs{{"kernel", c.k},         {"stride", c.s},      {"pads", c.pads},
                    {"dilation", c.dil},     {"ceil_mode", false}, {"channels_last", true},
                    {"no_indices", !indices}};
        const DeviceArray dx(x, c.off), dy(ys, t, c.off), di(ys, i64);
        TensorView iv = di.view();
        if (!indices) iv.data = nullptr;
        run_kernel(OpId::MaxPool, Backend::cuda, attrs, {dx.view()}, {dy.view(), iv});
        expect_same(dy.host(), want, what + " values");
        if (indices) expect_same(di.host(), want_idx, what + " indices");
      }
    }
}

// ---- adaptive average pooling, NHWC

// Window [lo, hi) of output o of `out` over `in`.
void adaptive_window(int64_t o, int64_t in, int64_t out, int64_t& lo, int64_t& hi) {
  lo = o * in / out;
  hi = ((o + 1) * in + out - 1) / out;
}

// The CUDA kernels' arithmetic on the host: taps summed in (h, w) order in A from 0, then
// divided by their count in A. With A = double, the float64 reference.
template <typename A>
std::vector<A> ref_adaptive(const std::vector<A>& x, const Shape& xs, const Shape& ys) {
  const int64_t H = xs[1], W = xs[2], C = xs[3];
  std::vector<A> y(static_cast<size_t>(numel(ys)));
  for (int64_t n = 0; n < ys[0]; ++n)
    for (int64_t oh = 0; oh < ys[1]; ++oh)
      for (int64_t ow = 0; ow < ys[2]; ++ow) {
        int64_t h0, h1, w0, w1;
        adaptive_window(oh, H, ys[1], h0, h1);
        adaptive_window(ow, W, ys[2], w0, w1);
        for (int64_t ch = 0; ch < C; ++ch) {
          A sum = A(0);
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w)
              sum += x[static_cast<size_t>(((n * H + h) * W + w) * C + ch)];
          y[static_cast<size_t>(((n * ys[1] + oh) * ys[2] + ow) * C + ch)] =
              sum / static_cast<A>((h1 - h0) * (w1 - w0));
        }
      }
  return y;
}

TEST(CudaAdaptiveAvgPool, NhwcMatchesInOrderSums) {
  REQUIRE_GPU();
  struct AdaptiveCase {
    Shape x;  // NHWC
    int64_t oh, ow;
  };
  const AdaptiveCase cases[] = {
      {{32, 7, 7, 2048}, 1, 1},   // ResNet's global pool: few outputs, a thread per element
      {{2, 7, 10, 24}, 3, 4},     // uneven windows
      {{3, 5, 5, 3}, 1, 1},       // C odd
      {{2, 40, 3, 16}, 1, 1},     // more taps than one batch of loads ahead
      {{8, 32, 32, 256}, 32, 32}  // many outputs: V channels a thread
  };
  for (const AdaptiveCase& c : cases)
    for (DType t : {f32, f64, f16, bf16}) {
      const Shape ys = {c.x[0], c.oh, c.ow, c.x[3]};
      const std::string what =
          fmt::format("adaptive_avg_pool x {} -> {} {}", to_string(c.x), to_string(ys), name(t));
      const Array x = random_array(c.x, t);
      const DeviceArray dx(x), dy(ys, t);
      run_kernel(OpId::AdaptiveAvgPool, Backend::cuda, Attrs{{"channels_last", true}}, {dx.view()},
                 {dy.view()});
      const Array got = dy.host();
      const auto x64 = to_f64(x);
      if (t == f32) {  // the same float sums in the same order
        const std::vector<float> xf(x.data<float>(), x.data<float>() + x.numel());
        const std::vector<float> want = ref_adaptive(xf, c.x, ys);
        expect_same(got, Array::from_vector(want, ys), what);
      } else if (t == f64) {
        expect_same(got, Array::from_vector(ref_adaptive(x64, c.x, ys), ys), what);
      } else {
        SCOPED_TRACE(what);
        expect_close(got, ys, ref_adaptive(x64, c.x, ys), tolerance(t), tolerance(t));
      }
    }
}

}  // namespace
}  // namespace kiln
