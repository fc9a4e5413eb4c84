// Kernel choices that the specializations of a dynamic executable on CUDA share
// (KernelEnv::many_shapes): cuBLASLt algorithms chosen once for a bucket of sizes and checked for
// each real size (results against float64 products at sizes inside and at the edges of buckets,
// and the heuristic queried once per bucket, not once per shape, counted from the profiler's
// "cuBLASLt heuristic" spans; a new bucket borrowing a launched neighbour's), and generated
// elementwise kernels that a batch of one takes from a larger batch (nothing compiled, the values
// the CPU computes).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "core/device_backend.h"
#include "kiln/kiln.h"
#include "support/gpu.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

constexpr int64_t kIn = 96, kOut = 80, kHeads = 3, kDim = 40, kKeys = 24;

// y = linear(x, w, b) of x (rows, 96), and z = q · kᵀ-like batched products of (3, rows, 40)
// by (3, 40, 24): the rows are dynamic in both.
struct Net {
  Graph g;
  Tensor x, q, y, z;
  Array w, b, k;
  explicit Net(DType t) {
    w = random_array({kOut, kIn}, t);
    b = random_array({kOut}, t);
    k = random_array({kHeads, kDim, kKeys}, t);
    x = g.placeholder({-1, kIn}, t, "x");
    q = g.placeholder({kHeads, -1, kDim}, t, "q");
    y = linear(x, g.constant(w, "w"), g.constant(b, "b"));
    z = matmul(q, g.constant(k, "k"));
  }
};

// a (batch, rows, inner) · b (batch, inner, cols) [+ bias (cols)] in float64, with the sum of
// |terms| of each element (the magnitude its rounding scales with)
void product(const std::vector<double>& a, const std::vector<double>& b, int64_t batch,
             int64_t rows, int64_t inner, int64_t cols, bool b_transposed,
             const std::vector<double>* bias, std::vector<double>& out,
             std::vector<double>& magnitude) {
  out.assign(batch * rows * cols, 0);
  magnitude.assign(out.size(), 0);
  for (int64_t s = 0; s < batch; ++s)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        double acc = bias ? (*bias)[c] : 0, mag = bias ? std::abs((*bias)[c]) : 0;
        for (int64_t i = 0; i < inner; ++i) {
          const double bv = b_transposed ? b[c * inner + i] : b[(s * inner + i) * cols + c];
          const double term = a[(s * rows + r) * inner + i] * bv;
          acc += term;
          mag += std::abs(term);
        }
        out[(s * rows + r) * cols + c] = acc;
        magnitude[(s * rows + r) * cols + c] = mag;
      }
}

class ManyShapes : public ::testing::TestWithParam<DType> {};

TEST_P(ManyShapes, ProductsMatchFloat64AtSizesAcrossBuckets) {
  REQUIRE_GPU();
  const DType t = GetParam();
  Net n(t);
  Executable exe = n.g.compile(Device::cuda(0), {}, {n.y, n.z});
  ASSERT_TRUE(exe.is_dynamic());
  const std::vector<double> w = to_f64(n.w), b = to_f64(n.b), k = to_f64(n.k);
  // bucket edges (2^j, 3 * 2^(j-1)) and the sizes just past them
  for (int64_t rows : {1, 2, 3, 5, 7, 12, 13, 96, 97, 100, 333, 768, 769, 1000, 1537}) {
    SCOPED_TRACE(fmt::format("{} rows, {}", rows, name(t)));
    const Array xv = random_array({rows, kIn}, t), qv = random_array({kHeads, rows, kDim}, t);
    const auto out = exe.run({{n.x, xv.to(Device::cuda(0))}, {n.q, qv.to(Device::cuda(0))}});
    std::vector<double> want, mag;
    product(to_f64(xv), w, 1, rows, kIn, kOut, true, &b, want, mag);
    // low-precision outputs round once (their f32 sums within a few ulps of f32)
    const double rtol = t == f32 ? 1e-5 : tolerance(t), atol = 1e-6;
    ASSERT_EQ(out[0].shape(), (Shape{rows, kOut}));
    expect_close_to_magnitude(out[0].to(Device::cpu()).astype(f32), want, mag, rtol, atol);
    product(to_f64(qv), k, kHeads, rows, kDim, kKeys, false, nullptr, want, mag);
    ASSERT_EQ(out[1].shape(), (Shape{kHeads, rows, kKeys}));
    expect_close_to_magnitude(out[1].to(Device::cpu()).astype(f32), want, mag, rtol, atol);
  }
}

INSTANTIATE_TEST_SUITE_P(Types, ManyShapes, ::testing::Values(f32, bf16, f16),
                         [](const auto& info) { return std::string(name(info.param)); });

// New shapes inside one bucket (1025..1536 rows) query cuBLASLt's heuristic at most once per
// product between them; an executable compiled for one of those shapes queries its own.
TEST(ManyShapesPlans, OneHeuristicQueryPerBucketNotPerShape) {
  REQUIRE_GPU();
  Net n(f32);
  Executable exe = n.g.compile(Device::cuda(0), {}, {n.y, n.z});
  auto queries = [](const Profile& p) {
    return std::count_if(p.spans.begin(), p.spans.end(),
                         [](const ProfileSpan& s) { return s.name == "cuBLASLt heuristic"; });
  };
  const std::vector<int64_t> sizes{1100, 1201, 1302, 1403, 1504, 1535};
  ProfileScope ps;
  for (int64_t rows : sizes) {
    const auto out = exe.run({{n.x, random_array({rows, kIn}, f32).to(Device::cuda(0))},
                              {n.q, random_array({kHeads, rows, kDim}, f32).to(Device::cuda(0))}});
    ASSERT_EQ(out[0].shape(), (Shape{rows, kOut}));
  }
  const Profile p = ps.stop();
  EXPECT_EQ(exe.shape_cache().misses, static_cast<int64_t>(sizes.size()));
  // two products (the linear and the batched matmul), each at most once for bucket 1536
  EXPECT_LE(queries(p), 2) << "the heuristic ran for each shape";

  // an executable of one shape takes the heuristic's choice for its exact sizes
  Graph g;
  auto x = g.placeholder({1403, kIn}, f32, "x");
  auto y = linear(x, g.constant(n.w, "w"), g.constant(n.b, "b"));
  Executable fixed = g.compile(Device::cuda(0), {}, {y});
  ProfileScope ps2;
  const Array xv = random_array({1403, kIn}, f32);
  const Array got = fixed.run({{x, xv.to(Device::cuda(0))}})[0].to(Device::cpu());
  EXPECT_EQ(queries(ps2.stop()), 1) << "a fixed executable's product took a bucket's plan";
  std::vector<double> want, mag;
  const std::vector<double> w = to_f64(n.w), b = to_f64(n.b);
  product(to_f64(xv), w, 1, 1403, kIn, kOut, true, &b, want, mag);
  expect_close_to_magnitude(got, want, mag, 1e-5, 1e-6);
}

// A size bucket not planned yet borrows the algorithm of a launched bucket within a factor of two
// of its rows: its first call queries no heuristic; results as float64's. With
// KILN_GEMM_BORROW=0 a new bucket queries its own.
TEST(ManyShapesPlans, ANewBucketBorrowsALaunchedNeighboursAlgorithm) {
  REQUIRE_GPU();
  constexpr int64_t in = 72, out = 56;  // (sizes no other test plans)
  Graph g;
  const Array w = random_array({out, in}, f32), b = random_array({out}, f32);
  auto x = g.placeholder({-1, in}, f32, "x");
  auto y = linear(x, g.constant(w, "w"), g.constant(b, "b"));
  Executable exe = g.compile(Device::cuda(0), {}, {y});
  const std::vector<double> wd = to_f64(w), bd = to_f64(b);
  auto queries_at = [&](int64_t rows) {
    ProfileScope ps;
    const Array xv = random_array({rows, in}, f32);
    const Array got = exe.run({{x, xv.to(Device::cuda(0))}})[0].to(Device::cpu());
    const Profile p = ps.stop();
    std::vector<double> want, mag;
    product(to_f64(xv), wd, 1, rows, in, out, true, &bd, want, mag);
    expect_close_to_magnitude(got, want, mag, 1e-5, 1e-6);
    return std::count_if(p.spans.begin(), p.spans.end(),
                         [](const ProfileSpan& s) { return s.name == "cuBLASLt heuristic"; });
  };
  EXPECT_EQ(queries_at(1000), 1);  // bucket 1024: planned
  EXPECT_EQ(queries_at(1500), 0) << "bucket 1536 did not borrow bucket 1024's algorithm";
  EXPECT_EQ(queries_at(1400), 0);
  ::setenv("KILN_GEMM_BORROW", "0", 1);
  const auto own = queries_at(1800);  // bucket 2048: its own
  ::unsetenv("KILN_GEMM_BORROW");
  EXPECT_EQ(own, 1);
}

// A batch of one makes the broadcast input pos (1, 8, 16) of tanh(2x + pos) as large as the
// output: the kernel that batch 4 compiled (reading pos with strides) runs it.
TEST(ManyShapesKernels, BatchOfOneTakesTheKernelOfALargerBatch) {
  REQUIRE_GPU();
  DeviceBackend& backend = *cuda_backend();
  Graph g;
  auto x = g.placeholder({-1, 8, 16}, f32, "x");
  auto y = tanh(x * 2.0 + g.constant(random_array({1, 8, 16}, f32), "pos"));
  Executable exe = g.compile(Device::cuda(0), {}, {y});
  Executable cpu = g.compile(Device::cpu(), {}, {y});
  for (int64_t batch : {4, 1}) {
    SCOPED_TRACE(fmt::format("batch {}", batch));
    const Array xv = random_array({batch, 8, 16}, f32);
    const int64_t before = backend.kernels_compiled();
    const Array got = exe.run({{x, xv.to(Device::cuda(0))}})[0].to(Device::cpu());
    if (batch == 1) EXPECT_EQ(backend.kernels_compiled(), before) << "batch 1 compiled a kernel";
    const Array want = cpu.run({{x, xv}})[0];
    expect_close(got, want.shape(), to_f64(want), 2e-6, 1e-6);
  }
  EXPECT_NE(exe.dump().find("fused_elementwise"), std::string::npos) << exe.dump();
}

// Chains are fused once, on the symbolic program (fuse_for_any_shape), beside products: a new
// shape's first call runs no chain fusion, and its results are the CPU's.
TEST(ManyShapesKernels, ChainsFusedOnceServeEveryShape) {
  REQUIRE_GPU();
  Graph g;
  auto x = g.placeholder({-1, -1, 32}, f32, "x");
  auto z = g.placeholder({-1, 32}, f32, "z");
  const Array w = random_array({32, 32}, f32);
  const Tensor h = linear(x, g.constant(w, "w"));
  const Tensor y = tanh(expand(h, shape_of(x)) * 2.0 + 1.0) * reshape_to(z, shape_of(x));
  Executable exe = g.compile(Device::cuda(0), {}, {y});
  Executable cpu = g.compile(Device::cpu(), {}, {y});
  bool first = true;
  for (auto [b, s] : {std::pair<int64_t, int64_t>{2, 3}, {1, 7}, {4, 1}, {3, 50}}) {
    SCOPED_TRACE(fmt::format("({}, {})", b, s));
    const Array xv = random_array({b, s, 32}, f32), zv = random_array({b * s, 32}, f32);
    ProfileScope ps;
    const Array got =
        exe.run({{x, xv.to(Device::cuda(0))}, {z, zv.to(Device::cuda(0))}})[0].to(Device::cpu());
    const Profile prof = ps.stop();
    int once = 0, per_shape = 0;
    for (const ProfileSpan& sp : prof.spans) {
      once += sp.kind == SpanKind::compile && sp.name == "fuse_elementwise_chains";
      per_shape += sp.kind == SpanKind::compile && sp.name == "fuse_elementwise";
    }
    EXPECT_EQ(once, first ? 1 : 0);  // (the first call builds the symbolic program)
    EXPECT_EQ(per_shape, 0) << "a specialization fused chains again";
    first = false;
    const Array want = cpu.run({{x, xv}, {z, zv}})[0];
    expect_close(got, want.shape(), to_f64(want), 1e-5, 1e-5);
  }
  EXPECT_NE(exe.dump().find("fused_elementwise"), std::string::npos) << exe.dump();
}

}  // namespace
}  // namespace kiln
