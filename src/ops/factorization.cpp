// Cholesky factorization and triangular solves (family linalg). Attrs:
//   cholesky: upper (bool). Input a (B..., n, n) f32/f64; out (B..., n, n), the other triangle
//     zero. Reads only the lower (upper) triangle of a; not positive definite -> all-NaN matrix.
//   triangular_solve: upper, left, transpose, unit_diagonal (bools). Inputs a (B..., n, n),
//     b (B..., n, k) when left else (B..., k, n), one batch shape (the builder broadcasts);
//     out has b's shape.
// Gradients are written with these ops: each lives on the triangle its kernel reads.
#include "kiln/autodiff.h"
#include "kiln/ops/core.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/transform.h"
#include "ops/common.h"
#include "ops/factorization_params.h"

namespace kiln {

using namespace ops;

namespace {
constexpr DTypeSet kLinalgTypes{f32, f64};

void require_square(const InferContext& ctx, int i, const char* what) {
  const Shape& s = ctx.inputs[i].shape;
  if (s.size() < 2 || !dims_match(s[s.size() - 1], s[s.size() - 2]))
    fail<ShapeError>("[{}] {} must be square matrices (..., n, n), got shape {}", ctx.name(), what,
                     str(s));
  require_dtype(ctx, i, kLinalgTypes, "f32 or f64");
}

std::vector<TensorInfo> infer_cholesky(const InferContext& ctx) {
  require_square(ctx, 0, "a");
  return {ctx.inputs[0]};
}

std::vector<TensorInfo> infer_triangular_solve(const InferContext& ctx) {
  require_square(ctx, 0, "a");
  const TensorInfo &a = ctx.inputs[0], &b = ctx.inputs[1];
  if (b.dtype != a.dtype)
    fail<DTypeError>("[triangular_solve] a has dtype {} but b has dtype {}", name(a.dtype),
                     name(b.dtype));
  const bool left = ctx.attrs.b("left");
  const size_t r = a.shape.size();
  const int64_t n = a.shape[r - 1];
  if (b.shape.size() != r ||
      !shapes_match(Shape(a.shape.begin(), a.shape.end() - 2),
                    Shape(b.shape.begin(), b.shape.end() - 2)) ||
      !dims_match(left ? b.shape[r - 2] : b.shape[r - 1], n))
    fail<ShapeError>("[triangular_solve] a {} and b {} must be (..., n, n) and {}", str(a.shape),
                     str(b.shape), left ? "(..., n, k) (left)" : "(..., k, n) (right)");
  return {b};
}

using Grads = std::vector<std::optional<Tensor>>;

Tensor swap_last2(const Tensor& x) {
  std::vector<int64_t> perm(static_cast<size_t>(x.rank()));
  for (int i = 0; i < x.rank(); ++i) perm[i] = i;
  std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
  return transpose(x, perm);
}

// x's lower (upper) triangle below (above) the diagonal, and its diagonal times `diag`.
Tensor triangle(const Tensor& x, bool lower, double diag) {
  const Tensor r = coordinate_along_axis(x, -2, i32), c = coordinate_along_axis(x, -1, i32);
  const Tensor zero = scalar_like(x, 0), one = scalar_like(x, 1);
  Tensor f = where(lower ? greater(r, c) : less(r, c), one, zero);
  if (diag != 0) f = where(equal(r, c), scalar_like(x, diag), f);
  return x * f;
}

// With L = chol(A) read from the lower triangle: S = L⁻ᵀ Φ(Lᵀ gL) L⁻¹ is the gradient for a
// symmetric perturbation of A, so the lower-triangle entries get Φ(S + Sᵀ) (Φ: lower triangle,
// diagonal halved). The upper factor is the transposed problem.
Grads vjp_cholesky(const VjpContext& c) {
  const bool upper = c.attrs.b("upper");
  const Tensor L = upper ? swap_last2(c.outputs[0]) : c.outputs[0];
  Tensor gL = *c.cotangents[0];
  gL = upper ? swap_last2(triangle(gL, false, 1)) : triangle(gL, true, 1);
  const Tensor p = triangle(matmul(swap_last2(L), gL), true, 0.5);
  TriangularSolveOptions o;
  o.transpose = true;
  const Tensor y = triangular_solve(L, p, o);  // Lᵀ y = p
  o.transpose = false;
  o.left = false;
  const Tensor s = triangular_solve(L, y, o);  // s L = y
  const Tensor g = triangle(s + swap_last2(s), true, 0.5);
  return {upper ? swap_last2(g) : g};
}

// M = op(a). Left: x = M⁻¹ b, gb = M⁻ᵀ gx, gM = -gb xᵀ. Right: x = b M⁻¹, gb = gx M⁻ᵀ,
// gM = -xᵀ gb.
Grads vjp_triangular_solve(const VjpContext& c) {
  TriangularSolveOptions o;
  o.upper = c.attrs.b("upper");
  o.left = c.attrs.b("left");
  o.transpose = c.attrs.b("transpose");
  o.unit_diagonal = c.attrs.b("unit_diagonal");
  const Tensor& x = c.outputs[0];
  TriangularSolveOptions ot = o;
  ot.transpose = !o.transpose;
  const Tensor gb = triangular_solve(c.inputs[0], *c.cotangents[0], ot);
  Tensor gm = o.left ? matmul(gb, swap_last2(x)) : matmul(swap_last2(x), gb);
  if (o.transpose) gm = swap_last2(gm);
  const Tensor ga = triangle(-gm, !o.upper, o.unit_diagonal ? 0 : 1);
  return {ga, gb};
}
}  // namespace

void register_factorization_ops() {
  define_op(OpId::Cholesky)
      .set_infer(infer_cholesky)
      .grad(vjp_cholesky)
      .inputs(1)
      .params<FactorizationParams>();
  define_op(OpId::TriangularSolve)
      .set_infer(infer_triangular_solve)
      .grad(vjp_triangular_solve)
      .inputs(2)
      .params<FactorizationParams>();
}

Tensor cholesky(const Tensor& a, bool upper) {
  return make_node1(OpId::Cholesky, {a}, {{"upper", upper}});
}

Tensor triangular_solve(const Tensor& a, const Tensor& b, const TriangularSolveOptions& o) {
  const char* op = "triangular_solve";
  const DType t = promote(a.dtype(), b.dtype());
  const Shape as = a.shape(), bs = b.shape();
  if (as.size() < 2 || bs.size() < 2)
    fail<ShapeError>("[{}] a {} and b {} must have rank >= 2", op, str(as), str(bs));
  Shape batch;
  if (!broadcast_shapes(Shape(as.begin(), as.end() - 2), Shape(bs.begin(), bs.end() - 2), batch))
    fail<ShapeError>("[{}] batch dims of a {} and b {} do not broadcast", op, str(as), str(bs));
  auto to_batch = [&](const Tensor& x) {
    const Tensor y = cast_to(x, t);
    const Shape s = y.shape();
    Shape want = batch;
    want.insert(want.end(), s.end() - 2, s.end());
    return s == want ? y : broadcast_to(y, want);
  };
  return make_node1(OpId::TriangularSolve, {to_batch(a), to_batch(b)},
                    {{"upper", o.upper},
                     {"left", o.left},
                     {"transpose", o.transpose},
                     {"unit_diagonal", o.unit_diagonal}});
}

}  // namespace kiln
