// Placeholder, Constant, Full, Arange.
//   full:   attrs shape (ints), value (float), dtype
//   arange: attrs start, stop, step (floats), dtype
#include <cmath>

#include "kiln/ops/core.h"
#include "ops/common.h"

namespace kiln {

using namespace ops;

namespace {
std::vector<TensorInfo> infer_placeholder(const InferContext& ctx) {
  return {{ctx.attrs.ints("shape"), ctx.attrs.dtype("dtype")}};
}
std::vector<TensorInfo> infer_constant(const InferContext& ctx) {
  fail<Error>("[constant] constants carry their own shape");  // never re-inferred
}
std::vector<TensorInfo> infer_full(const InferContext& ctx) {
  return {{ctx.attrs.ints("shape"), ctx.attrs.dtype("dtype")}};
}
int64_t arange_count(double start, double stop, double step) {
  double n = std::ceil((stop - start) / step);
  return n > 0 ? static_cast<int64_t>(n) : 0;
}
std::vector<TensorInfo> infer_arange(const InferContext& ctx) {
  double start = ctx.attrs.f("start"), stop = ctx.attrs.f("stop"), step = ctx.attrs.f("step");
  return {{{arange_count(start, stop, step)}, ctx.attrs.dtype("dtype")}};
}
}  // namespace

void register_core_ops() {
  // sources: nothing to differentiate through
  define_op(OpId::Placeholder).set_infer(infer_placeholder).not_differentiable();
  define_op(OpId::Constant).set_infer(infer_constant).not_differentiable();
  define_op(OpId::Full).set_infer(infer_full).not_differentiable();
  define_op(OpId::Arange).set_infer(infer_arange).not_differentiable();
}

Tensor constant(Graph& g, const Array& value) { return g.constant(value); }

Tensor full(Graph& g, const Shape& shape, double value, DType dtype) {
  for (int64_t d : shape)
    if (d < 0) fail<ShapeError>("[full] shape {} must be static and non-negative", str(shape));
  return detail::make_source_node(g.impl(), OpId::Full,
                                  {{"shape", shape}, {"value", value}, {"dtype", dtype}})[0];
}
Tensor zeros(Graph& g, const Shape& shape, DType dtype) { return full(g, shape, 0.0, dtype); }
Tensor ones(Graph& g, const Shape& shape, DType dtype) { return full(g, shape, 1.0, dtype); }

Tensor arange(Graph& g, double start, double stop, double step, DType dtype) {
  if (step == 0 || !std::isfinite(start) || !std::isfinite(stop) || !std::isfinite(step))
    fail<ValueError>("[arange] needs finite start/stop and a non-zero step (got {}, {}, {})", start,
                     stop, step);
  if (dtype == boolean) fail<DTypeError>("[arange] dtype bool is not allowed");
  return detail::make_source_node(
      g.impl(), OpId::Arange,
      {{"start", start}, {"stop", stop}, {"step", step}, {"dtype", dtype}})[0];
}

Tensor scalar_like(const Tensor& x, double value) {
  KILN_ASSERT(x.valid());
  Array a = Array::scalar(value).astype(x.dtype());
  // the constant lives on x's graph
  detail::Node n;
  n.op = OpId::Constant;
  n.outputs = {{{}, x.dtype()}};
  n.value = a;
  auto* g = x.graph_impl();
  return Tensor(g, g->add_inferred(std::move(n)), 0);
}

}  // namespace kiln
