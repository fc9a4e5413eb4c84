// cholesky, triangular_solve and einsum against float64 references: a Cholesky loop, Gaussian
// elimination with pivoting on the dense op(a), and brute-force summation over every index.
#include <cmath>
#include <map>

#include "support/gradcheck.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;
using Ts = std::vector<Tensor>;

// Symmetric positive-definite matrices x xᵀ + n I of shape (batch..., n, n), float64.
Array random_spd(const Shape& batch, int64_t n) {
  Shape s = batch;
  s.push_back(n);
  s.push_back(n);
  const Array x = random_array(s, f64);
  Array a = Array::zeros(s, f64);
  const auto vx = to_f64(x);
  double* pa = a.data<double>();
  for (int64_t b = 0; b < numel(batch); ++b)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double v = i == j ? static_cast<double>(n) : 0.0;
        for (int64_t k = 0; k < n; ++k) v += vx[(b * n + i) * n + k] * vx[(b * n + j) * n + k];
        pa[(b * n + i) * n + j] = v;
      }
  return a;
}

std::vector<double> ref_cholesky(const std::vector<double>& a, int64_t batch, int64_t n,
                                 bool upper) {
  std::vector<double> r(a.size(), 0.0);
  for (int64_t b = 0; b < batch; ++b) {
    const double* m = a.data() + b * n * n;
    double* l = r.data() + b * n * n;
    for (int64_t j = 0; j < n; ++j) {
      double d = m[j * n + j];
      for (int64_t k = 0; k < j; ++k) d -= l[j * n + k] * l[j * n + k];
      l[j * n + j] = std::sqrt(d);
      for (int64_t i = j + 1; i < n; ++i) {
        double s = m[i * n + j];
        for (int64_t k = 0; k < j; ++k) s -= l[i * n + k] * l[j * n + k];
        l[i * n + j] = s / l[j * n + j];
      }
    }
    if (upper)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < i; ++j) std::swap(l[i * n + j], l[j * n + i]);
  }
  return r;
}

// a with junk written over the triangle cholesky must not read.
Array with_junk(const Array& a, bool upper) {
  Array r = a.copy();
  const int64_t n = a.shape().back();
  double* p = r.data<double>();
  for (int64_t b = 0; b < a.numel() / std::max<int64_t>(1, n * n); ++b)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j)
        if (upper ? j < i : j > i) p[(b * n + i) * n + j] = 100.0 + static_cast<double>(i - j);
  return r;
}

TEST(Cholesky, MatchesReference) {
  struct C {
    Shape batch;
    int64_t n;
  };
  for (const C& c : {C{{}, 1}, C{{}, 5}, C{{3}, 7}, C{{2, 2}, 16}, C{{}, 150}, C{{2}, 0}})
    for (bool upper : {false, true})
      for (DType t : {f32, f64}) {
        SCOPED_TRACE(::testing::Message()
                     << to_string(c.batch) << " n " << c.n << " upper " << upper << " " << name(t));
        const Array a = random_spd(c.batch, c.n);
        const auto ref = ref_cholesky(to_f64(a), numel(c.batch), c.n, upper);
        Graph g;
        auto pa = g.placeholder(a.shape(), t, "a");
        const Array y = eval1(g, cholesky(pa, upper), {{pa, with_junk(a, upper).astype(t)}});
        const double tol = t == f32 ? 2e-5 : 1e-11;
        expect_close(y, a.shape(), ref, tol, tol * std::sqrt(static_cast<double>(c.n)));
      }
}

TEST(Cholesky, NotPositiveDefiniteGivesNaN) {
  Graph g;
  Array a = random_spd({2}, 3);
  a.data<double>()[9 + 4] = -50;  // second matrix: a negative pivot
  auto pa = g.placeholder(a.shape(), f64, "a");
  const auto y = to_f64(eval1(g, cholesky(pa), {{pa, a}}));
  const auto ref = ref_cholesky(to_f64(a), 1, 3, false);
  for (int i = 0; i < 9; ++i) EXPECT_NEAR(y[i], ref[i], 1e-12);
  for (int i = 9; i < 18; ++i) EXPECT_TRUE(std::isnan(y[i])) << i;
}

TEST(Cholesky, RejectsBadInputs) {
  Graph g;
  expect_error<ShapeError>(
      [&] {
        cholesky(g.placeholder({3, 4}, f32, "a"));
      },
      {"[cholesky]", "(3, 4)"});
  expect_error<ShapeError>([&] { cholesky(g.placeholder({3}, f32, "v")); }, {"[cholesky]"});
  expect_error<DTypeError>(
      [&] {
        cholesky(g.placeholder({3, 3}, i32, "i"));
      },
      {"[cholesky]", "i32"});
}

// ---- triangular_solve ----

// A well-conditioned triangular-ish matrix: diagonal of magnitude [1, 2], small off-diagonal
// entries, and junk in the triangle that must not be read.
Array random_triangular(const Shape& s) {
  Array a = random_array(s, f64, -0.4, 0.4);
  const int64_t n = s.back();
  double* p = a.data<double>();
  for (int64_t b = 0; b < a.numel() / std::max<int64_t>(1, n * n); ++b)
    for (int64_t i = 0; i < n; ++i) {
      double& d = p[(b * n + i) * n + i];
      d = (d < 0 ? -1 : 1) * (1 + std::abs(d) * 2.5);
    }
  return a;
}

// x from op(a) x = b (left) or x op(a) = b by Gaussian elimination on the dense op(a).
std::vector<double> ref_solve(const Array& a, const Array& b, const Shape& batch,
                              const TriangularSolveOptions& o) {
  const int64_t n = a.shape().back();
  const Shape bs = b.shape();
  const int64_t r = bs[bs.size() - 2], c = bs.back();
  const Shape ab(a.shape().begin(), a.shape().end() - 2), bb(bs.begin(), bs.end() - 2);
  const auto va = to_f64(a), vb = to_f64(b);
  std::vector<double> out;
  for (int64_t bi = 0; bi < numel(batch); ++bi) {
    const auto idx = unravel(bi, batch);
    const double* m = va.data() + broadcast_offset(idx, ab, batch) * n * n;
    const double* rhs = vb.data() + broadcast_offset(idx, bb, batch) * r * c;
    // dense M with M x = y per column: left M = op(a); right M = op(a)ᵀ on xᵀ
    std::vector<double> M(static_cast<size_t>(n * n), 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const bool in = o.upper ? j >= i : j <= i;
        double v = in ? m[i * n + j] : 0.0;
        if (i == j && o.unit_diagonal) v = 1;
        const bool tr = o.transpose != !o.left;
        M[tr ? j * n + i : i * n + j] = v;
      }
    const int64_t k = o.left ? c : r;
    std::vector<double> x(static_cast<size_t>(r * c));
    for (int64_t s = 0; s < k; ++s) {
      std::vector<double> A = M, y(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) y[i] = o.left ? rhs[i * c + s] : rhs[s * n + i];
      for (int64_t col = 0; col < n; ++col) {
        int64_t piv = col;
        for (int64_t i = col + 1; i < n; ++i)
          if (std::abs(A[i * n + col]) > std::abs(A[piv * n + col])) piv = i;
        for (int64_t j = 0; j < n; ++j) std::swap(A[col * n + j], A[piv * n + j]);
        std::swap(y[col], y[piv]);
        for (int64_t i = col + 1; i < n; ++i) {
          const double f = A[i * n + col] / A[col * n + col];
          for (int64_t j = col; j < n; ++j) A[i * n + j] -= f * A[col * n + j];
          y[i] -= f * y[col];
        }
      }
      for (int64_t i = n - 1; i >= 0; --i) {
        double v = y[i];
        for (int64_t j = i + 1; j < n; ++j) v -= A[i * n + j] * y[j];
        y[i] = v / A[i * n + i];
      }
      for (int64_t i = 0; i < n; ++i) (o.left ? x[i * c + s] : x[s * n + i]) = y[i];
    }
    out.insert(out.end(), x.begin(), x.end());
  }
  return out;
}

std::vector<TriangularSolveOptions> all_options() {
  std::vector<TriangularSolveOptions> r;
  for (int f = 0; f < 16; ++f)
    r.push_back({(f & 1) != 0, (f & 2) != 0, (f & 4) != 0, (f & 8) != 0});
  return r;
}

TEST(TriangularSolve, MatchesReference) {
  struct C {
    Shape a, b;  // b for left; right swaps its last two dims
  };
  for (const C& c : {C{{4, 4}, {4, 3}}, C{{2, 1, 9, 9}, {3, 9, 5}}, C{{1, 1}, {2, 1, 1}},
                     C{{3, 70, 70}, {70, 2}}, C{{0, 3, 3}, {3, 2}}, C{{3, 3}, {3, 0}}})
    for (const auto& o : all_options())
      for (DType t : {f32, f64}) {
        Shape bs = c.b;
        if (!o.left) std::swap(bs[bs.size() - 1], bs[bs.size() - 2]);
        SCOPED_TRACE(::testing::Message()
                     << to_string(c.a) << " " << to_string(bs) << " upper " << o.upper << " left "
                     << o.left << " transpose " << o.transpose << " unit " << o.unit_diagonal << " "
                     << name(t));
        const Array a = random_triangular(c.a), b = random_array(bs, f64);
        Shape batch;
        ASSERT_TRUE(broadcast_shapes(Shape(c.a.begin(), c.a.end() - 2),
                                     Shape(bs.begin(), bs.end() - 2), batch));
        const auto ref = ref_solve(a, b, batch, o);
        Graph g;
        auto pa = g.placeholder(a.shape(), t, "a"), pb = g.placeholder(bs, t, "b");
        const Array y =
            eval1(g, triangular_solve(pa, pb, o), {{pa, a.astype(t)}, {pb, b.astype(t)}});
        Shape out = batch;
        out.insert(out.end(), bs.end() - 2, bs.end());
        const double tol = t == f32 ? 5e-5 : 1e-10;
        expect_close(y, out, ref, tol, tol);
      }
}

TEST(TriangularSolve, RejectsBadInputs) {
  Graph g;
  auto a = g.placeholder({3, 3}, f32, "a");
  expect_error<ShapeError>(
      [&] {
        triangular_solve(a, g.placeholder({4, 2}, f32, "b"));
      },
      {"[triangular_solve]", "(4, 2)"});
  TriangularSolveOptions right;
  right.left = false;
  expect_error<ShapeError>(
      [&] {
        triangular_solve(a, g.placeholder({3, 2}, f32, "b"), right);
      },
      {"[triangular_solve]", "(3, 2)"});
  expect_error<ShapeError>(
      [&] {
        triangular_solve(g.placeholder({3, 4}, f32, "r"), g.placeholder({3, 2}, f32, "b"));
      },
      {"[triangular_solve]", "(3, 4)"});
  expect_error<ShapeError>(
      [&] {
        triangular_solve(g.placeholder({2, 3, 3}, f32, "a2"), g.placeholder({4, 3, 1}, f32, "b4"));
      },
      {"[triangular_solve]", "broadcast"});
}

// ---- einsum ----

// Brute force: every assignment of the letters, product of the operands, summed into the output.
std::vector<double> ref_einsum(const std::string& eq, const std::vector<Array>& ops, Shape& shape) {
  const size_t arrow = eq.find("->");
  std::vector<std::string> specs;
  std::string lhs = eq.substr(0, arrow), out = eq.substr(arrow + 2);
  for (size_t p = 0;;) {
    const size_t q = lhs.find(',', p);
    specs.push_back(lhs.substr(p, q == std::string::npos ? std::string::npos : q - p));
    if (q == std::string::npos) break;
    p = q + 1;
  }
  std::map<char, int64_t> size;
  for (size_t i = 0; i < specs.size(); ++i)
    for (size_t d = 0; d < specs[i].size(); ++d) size[specs[i][d]] = ops[i].shape()[d];
  std::string letters;
  for (auto& [ch, n] : size) letters += ch;
  shape.clear();
  for (char ch : out) shape.push_back(size[ch]);
  std::vector<double> r(static_cast<size_t>(numel(shape)), 0.0);
  std::vector<std::vector<double>> vals;
  for (auto& a : ops) vals.push_back(to_f64(a));
  Shape all;
  for (char ch : letters) all.push_back(size[ch]);
  for (int64_t f = 0; f < numel(all); ++f) {
    const auto idx = unravel(f, all);
    auto at = [&](char ch) { return idx[letters.find(ch)]; };
    double prod = 1;
    for (size_t i = 0; i < specs.size(); ++i) {
      std::vector<int64_t> oi;
      for (char ch : specs[i]) oi.push_back(at(ch));
      prod *= vals[i][ravel(oi, ops[i].shape())];
    }
    std::vector<int64_t> o;
    for (char ch : out) o.push_back(at(ch));
    r[ravel(o, shape)] += prod;
  }
  return r;
}

struct EinsumCase {
  std::string eq;      // as given to kiln::einsum
  std::string ref_eq;  // explicit, without ellipsis (same operands)
  std::vector<Shape> shapes;
};

const std::vector<EinsumCase> kEinsum = {
    {"ij,jk->ik", "ij,jk->ik", {{3, 4}, {4, 5}}},
    {"ij,jk", "ij,jk->ik", {{3, 4}, {4, 5}}},
    {"bhqd,bhkd->bhqk", "bhqd,bhkd->bhqk", {{2, 3, 4, 5}, {2, 3, 6, 5}}},
    {"ij->ji", "ij->ji", {{3, 4}}},
    {"ii->", "ii->", {{4, 4}}},
    {"ii->i", "ii->i", {{5, 5}}},
    {"ij->", "ij->", {{3, 4}}},
    {"i,j->ij", "i,j->ij", {{3}, {4}}},
    {"i,i->", "i,i->", {{6}, {6}}},
    {"ij,jk,kl->il", "ij,jk,kl->il", {{2, 3}, {3, 4}, {4, 5}}},
    {"...ij,...jk->...ik", "aij,ajk->aik", {{2, 3, 4}, {2, 4, 5}}},
    {"b i j, b j -> b i", "bij,bj->bi", {{2, 3, 4}, {2, 4}}},
    {"iij->j", "iij->j", {{3, 3, 2}}},
    {"ijk,ikl->jl", "ijk,ikl->jl", {{2, 3, 4}, {2, 4, 5}}},
};

TEST(Einsum, MatchesBruteForce) {
  for (const auto& c : kEinsum)
    for (DType t : {f32, f64}) {
      SCOPED_TRACE(c.eq + " " + name(t));
      Graph g;
      std::vector<Array> vals;
      std::vector<Tensor> ins;
      Feeds feeds;
      for (size_t i = 0; i < c.shapes.size(); ++i) {
        vals.push_back(random_array(c.shapes[i], t));
        ins.push_back(g.placeholder(c.shapes[i], t, "x" + std::to_string(i)));
        feeds.push_back({ins.back(), vals.back()});
      }
      Shape shape;
      const auto ref = ref_einsum(c.ref_eq, vals, shape);
      const double tol = t == f32 ? 1e-5 : 1e-12;
      expect_close(eval1(g, einsum(c.eq, ins), feeds), shape, ref, tol, tol);
    }
}

TEST(Einsum, EllipsisBroadcasts) {
  Graph g;
  const Array a = random_array({2, 1, 3, 4}, f64), b = random_array({5, 4, 2}, f64);
  auto pa = g.placeholder(a.shape(), f64, "a"), pb = g.placeholder(b.shape(), f64, "b");
  const Array y = eval1(g, einsum("...ij,...jk->...ik", {pa, pb}), {{pa, a}, {pb, b}});
  const Array want = eval1(g, matmul(pa, pb), {{pa, a}, {pb, b}});
  expect_close(y, {2, 5, 3, 2}, to_f64(want), 1e-12, 1e-12);
}

TEST(Einsum, GradientsFiniteDifferences) {
  check_gradients(
      [](const Ts& x) {
        return einsum("bij,bjk->bik", {x[0], x[1]});
      },
      {random_array({2, 3, 4}, f64), random_array({2, 4, 2}, f64)});
  check_gradients(
      [](const Ts& x) {
        return einsum("ii,ij->j", {x[0], x[1]});
      },
      {random_array({3, 3}, f64), random_array({3, 2}, f64)});
}

TEST(Einsum, RejectsBadEquations) {
  Graph g;
  auto a = g.placeholder({3, 4}, f32, "a"), b = g.placeholder({5, 6}, f32, "b");
  expect_error<ValueError>([&] { einsum("ij,jk->ik", {a}); }, {"[einsum]", "2 operands"});
  expect_error<ValueError>([&] { einsum("ij->i->j", {a}); }, {"[einsum]", "->"});
  expect_error<ValueError>([&] { einsum("i1->i", {a}); }, {"[einsum]", "'1'"});
  expect_error<ValueError>([&] { einsum("ij->ii", {a}); }, {"[einsum]", "twice"});
  expect_error<ValueError>([&] { einsum("ij->k", {a}); }, {"[einsum]", "'k'"});
  expect_error<ValueError>([&] { einsum("i.j->i", {a}); }, {"[einsum]", "stray"});
  expect_error<ValueError>([&] { einsum("......->", {a}); }, {"[einsum]", "ellipsis"});
  expect_error<ShapeError>([&] { einsum("ijk->i", {a}); }, {"[einsum]", "(3, 4)"});
  expect_error<ShapeError>([&] { einsum("ij,jk->ik", {a, b}); }, {"[einsum]", "'j'"});
  expect_error<ShapeError>([&] { einsum("ii->i", {a}); }, {"[einsum]", "'i'"});
}

}  // namespace
}  // namespace kiln
