// Pooling over 1-3 spatial dims of an (N, C, spatial...) input; the kernel size sets how many.
//   max_pool: kernel, stride, pads (2*nd: begins then ends), dilation (ints), ceil_mode (bool).
//             Two outputs: the maxima and their i64 flat indices within each (n, c) plane.
//             no_indices (bool, internal: fuse_quant, and on the CPU drop_unread_pool_indices,
//             set it where nothing reads the indices).
//   avg_pool: kernel, stride, pads, ceil_mode, count_include_pad (bool)
//   adaptive_avg_pool: output_size (ints)
// max_pool and adaptive_avg_pool over 2 spatial dims may carry channels_last (bool, internal: the
// channels_last pass sets it; such nodes run Layout::channels_last kernels): input and outputs
// (N, H, W, C); the indices stay in-plane h*W + w. The kernels read the attributes as PoolParams.
// Their gradients are ops of their own, with `input_shape` (ints, static) the forward input's, or
// taken from a value computed from shapes (from_values: shape_of the input, whose spatial dims
// are dynamic when built; specialize_shapes writes it in):
//   max_pool_grad(dy, indices): dy added at the forward pass's flat in-plane indices
//   avg_pool_grad(dy): avg_pool's attributes; adaptive_avg_pool_grad(dy): output size from dy
// max_pool_grad and adaptive_avg_pool_grad may carry channels_last too (CUDA training programs):
// dy, indices and output (N, H, W, C); input_shape stays the NCHW one.
// Output sizes follow PyTorch: floor (or ceil) of (in + pads - dilation*(k-1) - 1) / stride + 1,
// where with ceil_mode the last window must start inside the input or the begin padding.
#include "core/sym_dim.h"
#include "kiln/ops/core.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/transform.h"
#include "ops/common.h"
#include "ops/pool_params.h"
#include "ops/shape_values.h"

namespace kiln {

using namespace ops;

namespace {
// Checks rank == nd + 2 and that spatial dims are not empty.
void require_spatial(const InferContext& ctx, int64_t nd, const char* what,
                     const std::vector<int64_t>& sizes) {
  const Shape& s = ctx.inputs[0].shape;
  if (static_cast<int64_t>(s.size()) != nd + 2)
    fail<ShapeError>("[{}] {} {} needs an input of rank {} (N, C, spatial...), got shape {}",
                     ctx.name(), what, str(sizes), nd + 2, str(s));
  for (int64_t d = 2; d < nd + 2; ++d)
    if (s[d] == 0)
      fail<ShapeError>("[{}] input shape {} has an empty spatial dim", ctx.name(), str(s));
}

void require_at_least(const InferContext& ctx, const char* key, int64_t lo) {
  for (int64_t v : ctx.attrs.ints(key))
    if (v < lo)
      fail<ValueError>("[{}] {} {} must be >= {} (input shape {})", ctx.name(), key,
                       str(ctx.attrs.ints(key)), lo, str(ctx.inputs[0].shape));
}

// Output shape of max or average pooling, validating the window attributes against the input.
Shape pooled_shape(const InferContext& ctx, const std::vector<int64_t>& dilation) {
  const auto& kernel = ctx.attrs.ints("kernel");
  const auto& stride = ctx.attrs.ints("stride");
  const auto& pads = ctx.attrs.ints("pads");
  const int64_t nd = static_cast<int64_t>(kernel.size());
  const Shape& in = ctx.inputs[0].shape;
  require_spatial(ctx, nd, "kernel", kernel);
  require_at_least(ctx, "kernel", 1);
  require_at_least(ctx, "stride", 1);
  require_at_least(ctx, "pads", 0);
  const bool ceil_mode = ctx.attrs.b("ceil_mode");
  Shape out{in[0], in[1]};
  for (int64_t d = 0; d < nd; ++d) {
    const int64_t eff = dilation[d] * (kernel[d] - 1) + 1, pb = pads[d], pe = pads[nd + d];
    if (pb > eff / 2 || pe > eff / 2)
      fail<ValueError>("[{}] padding {} must be at most half the kernel {} (input shape {})",
                       ctx.name(), str(pads), str(kernel), str(in));
    if (in[2 + d] < 0) {
      // symbolic unless ceil mode's last window could start in the end padding
      const int64_t span = sym::sub(sym::add(in[2 + d], pb + pe), eff);
      out.push_back(!ceil_mode              ? sym::add(sym::floordiv(span, stride[d]), 1)
                    : pe + stride[d] <= eff ? sym::add(sym::ceildiv(span, stride[d]), 1)
                                            : kDynamic);
      continue;
    }
    const int64_t span = in[2 + d] + pb + pe - eff;
    if (span < 0)
      fail<ShapeError>(
          "[{}] kernel {} (dilation {}) is larger than the padded input: shape {} "
          "with padding {}",
          ctx.name(), str(kernel), str(dilation), str(in), str(pads));
    int64_t o = (ceil_mode ? (span + stride[d] - 1) / stride[d] : span / stride[d]) + 1;
    if (ceil_mode && (o - 1) * stride[d] >= in[2 + d] + pb) --o;
    out.push_back(o);
  }
  return out;
}

std::vector<TensorInfo> infer_max_pool(const InferContext& ctx) {
  require_dtype(ctx, 0, kNumericTypes, "a numeric dtype");
  require_at_least(ctx, "dilation", 1);
  Shape out = pooled_shape(ctx, ctx.attrs.ints("dilation"));
  return {{out, ctx.inputs[0].dtype}, {out, i64}};
}
std::vector<TensorInfo> infer_avg_pool(const InferContext& ctx) {
  require_dtype(ctx, 0, kFloatTypes, "a float dtype");
  return {{pooled_shape(ctx, std::vector<int64_t>(ctx.attrs.ints("kernel").size(), 1)),
           ctx.inputs[0].dtype}};
}
std::vector<TensorInfo> infer_adaptive_avg_pool(const InferContext& ctx) {
  require_dtype(ctx, 0, kFloatTypes, "a float dtype");
  const auto& size = ctx.attrs.ints("output_size");
  require_spatial(ctx, static_cast<int64_t>(size.size()), "output_size", size);
  require_at_least(ctx, "output_size", 1);
  Shape out{ctx.inputs[0].shape[0], ctx.inputs[0].shape[1]};
  out.insert(out.end(), size.begin(), size.end());
  return {{out, ctx.inputs[0].dtype}};
}

// ---- gradient ops ----

// The forward input's shape of a gradient op: rank of dy, same N and C as dy (-1 there: dy's),
// static spatial dims.
Shape grad_input_shape(const InferContext& ctx) {
  require_dtype(ctx, 0, kFloatTypes, "a float dtype");
  require_rank(ctx, 0, 3, 5);
  const Shape& dy = ctx.inputs[0].shape;
  if (from_values(ctx)) {  // N and C as dy's; spatial dims known once the value is
    const int value = static_cast<int>(ctx.inputs.size()) - 1;
    if (value_length(ctx, value, "input_shape") != static_cast<int64_t>(dy.size()))
      fail<ShapeError>(
          "[{}] the input_shape value has {} entries; the gradient of shape {} needs {}",
          ctx.name(), ctx.inputs[value].shape[0], str(dy), dy.size());
    Shape in(dy.size(), kDynamic);
    in[0] = dy[0], in[1] = dy[1];
    return in;
  }
  Shape in = ctx.attrs.ints("input_shape");
  bool ok = in.size() == dy.size() && dims_match(in[0], dy[0]) && dims_match(in[1], dy[1]);
  for (size_t d = 2; ok && d < in.size(); ++d) ok = in[d] >= 0;
  if (!ok || in[0] < -1 || in[1] < -1)
    fail<ShapeError>(
        "[{}] input_shape {} must have static spatial dims, and the rank, N and C of the "
        "gradient of shape {}",
        ctx.name(), str(in), str(dy));
  if (in[0] < 0) in[0] = dy[0];
  if (in[1] < 0) in[1] = dy[1];
  return in;
}

std::vector<TensorInfo> infer_max_pool_grad(const InferContext& ctx) {
  Shape in = grad_input_shape(ctx);
  require_dtype(ctx, 1, DTypeSet{i32, i64}, "i32 or i64 indices");
  if (!shapes_match(ctx.inputs[1].shape, ctx.inputs[0].shape))
    fail<ShapeError>("[{}] indices of shape {} must have the gradient's shape {}", ctx.name(),
                     str(ctx.inputs[1].shape), str(ctx.inputs[0].shape));
  return {{in, ctx.inputs[0].dtype}};
}

std::vector<TensorInfo> infer_avg_pool_grad(const InferContext& ctx) {
  Shape in = grad_input_shape(ctx);
  if (from_values(ctx)) return {{in, ctx.inputs[0].dtype}};
  // the forward pass's inference on input_shape must give dy's shape
  const std::vector<TensorInfo> fwd_inputs{{in, ctx.inputs[0].dtype}};
  const InferContext fwd{ctx.op, ctx.attrs, fwd_inputs};
  const Shape expect = pooled_shape(fwd, std::vector<int64_t>(in.size() - 2, 1));
  if (!shapes_match(expect, ctx.inputs[0].shape))
    fail<ShapeError>(
        "[{}] gradient of shape {} does not match the pooled shape {} of input "
        "shape {}",
        ctx.name(), str(ctx.inputs[0].shape), str(expect), str(in));
  return {{in, ctx.inputs[0].dtype}};
}

std::vector<TensorInfo> infer_adaptive_avg_pool_grad(const InferContext& ctx) {
  Shape in = grad_input_shape(ctx);
  const Shape& dy = ctx.inputs[0].shape;
  for (size_t d = 2; d < dy.size() && !from_values(ctx); ++d)
    if (dy[d] < 1 || in[d] < 1)
      fail<ShapeError>(
          "[{}] gradient shape {} and input_shape {} need static, non-empty "
          "spatial dims",
          ctx.name(), str(dy), str(in));
  return {{in, ctx.inputs[0].dtype}};
}

// ---- gradient rules ----

using Grads = std::vector<std::optional<Tensor>>;

// Spatial dims of t (adaptive pooling's output size).
std::vector<int64_t> spatial(const Tensor& t) {
  const Shape s = t.shape();
  return {s.begin() + 2, s.end()};
}

// Scatters dy into the argmax positions the forward pass recorded (output 1), never recomputing
// them; the i64 indices output carries no cotangent. The gradient ops take the forward input's
// shape as the attribute where its spatial dims are static, else as the value shape_of(x).
Grads vjp_max_pool(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  const Tensor dy = c.cotangent_or_zeros(0);
  if (dynamic_spatial(x.shape())) return {max_pool_grad(dy, c.outputs[1], shape_of(x))};
  return {max_pool_grad(dy, c.outputs[1], x.shape())};
}
Grads vjp_avg_pool(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  if (dynamic_spatial(x.shape()))
    return {node_from_values(OpId::AvgPoolGrad, {*c.cotangents[0]}, c.attrs, {shape_of(x)})};
  Attrs attrs = c.attrs;
  attrs.set("input_shape", x.shape());
  return {make_node1(OpId::AvgPoolGrad, {*c.cotangents[0]}, attrs)};
}
Grads vjp_adaptive_avg_pool(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  if (dynamic_spatial(x.shape())) return {adaptive_avg_pool_grad(*c.cotangents[0], shape_of(x))};
  return {adaptive_avg_pool_grad(*c.cotangents[0], x.shape())};
}

// t (N, C, spatial...) as (N, C, plane) with the plane's size computed from t's shape: no -1
// to infer, so an empty batch reshapes too.
Tensor planes_of(const Tensor& t) {
  const int64_t r = t.rank();
  const Tensor s = shape_of(t);
  return reshape_to(t, concat({slice(s, {0}, {2}), prod(slice(s, {2}, {r}), {0}, true)}, 0));
}

// max_pool_grad is linear in dy; its transpose gathers g at the indices, plane by plane.
// (dy's N and C match the input's; its spatial dims and the input's may be known only when run.)
Grads vjp_max_pool_grad(const VjpContext& c) {
  const Tensor &dy = c.inputs[0], &g = *c.cotangents[0];
  if (c.attrs.b("from_values", false) || !is_static(dy.shape()) || !is_static(g.shape()))
    return {reshape_like(gather_elements(planes_of(g), planes_of(c.inputs[1]), 2), dy),
            std::nullopt};
  const Shape in = g.shape();
  auto plane = [](const Shape& s) { return numel(Shape(s.begin() + 2, s.end())); };
  const Tensor flat = reshape(g, {in[0], in[1], plane(in)});
  const Tensor idx = reshape(c.inputs[1], {in[0], in[1], plane(dy.shape())});
  return {reshape(gather_elements(flat, idx, 2), dy.shape()), std::nullopt};
}
// The pooling ops are linear, so the gradient of their gradient op is the pooling itself (the
// input_shape value, where there is one, gets no gradient).
Grads vjp_avg_pool_grad(const VjpContext& c) {
  Attrs attrs;
  for (const auto& [key, value] : c.attrs.items())
    if (key != "input_shape" && key != "from_values") attrs.set(key, value);
  return {make_node1(OpId::AvgPool, {*c.cotangents[0]}, attrs)};
}
Grads vjp_adaptive_avg_pool_grad(const VjpContext& c) {
  const Shape out = spatial(c.inputs[0]);
  if (!is_static(out))
    fail<UnsupportedError>(
        "[gradients] the gradient of adaptive_avg_pool_grad needs the pooled output's spatial "
        "size static, got gradient shape {}",
        str(c.inputs[0].shape()));
  return {adaptive_avg_pool(*c.cotangents[0], out)};
}

// nd entries, or `dflt` repeated when empty.
std::vector<int64_t> per_dim(const char* op, const char* key, const std::vector<int64_t>& v,
                             const std::vector<int64_t>& dflt) {
  if (v.empty()) return dflt;
  if (v.size() != dflt.size())
    fail<ValueError>("[{}] {} has {} entries; expected {} (one per spatial dim)", op, key, v.size(),
                     dflt.size());
  return v;
}

void check_kernel(const char* op, const std::vector<int64_t>& kernel) {
  if (kernel.empty() || kernel.size() > 3)
    fail<ValueError>("[{}] kernel {} must have 1 to 3 entries (one per spatial dim)", op,
                     str(kernel));
}

// The attributes shared by max and average pooling, with defaults filled in.
Attrs window_attrs(const char* op, const PoolOptions& o) {
  check_kernel(op, o.kernel);
  const size_t nd = o.kernel.size();
  std::vector<int64_t> pads = o.padding;
  if (pads.empty()) pads.assign(2 * nd, 0);
  else if (pads.size() == nd) pads.insert(pads.end(), o.padding.begin(), o.padding.end());
  else if (pads.size() != 2 * nd)
    fail<ValueError>("[{}] padding has {} entries; expected {} or {} for kernel {}", op,
                     pads.size(), nd, 2 * nd, str(o.kernel));
  return {{"kernel", o.kernel},
          {"stride", per_dim(op, "stride", o.stride, o.kernel)},
          {"pads", pads},
          {"ceil_mode", o.ceil_mode}};
}

// Average pooling's attributes: the window's plus count_include_pad; no dilation.
Attrs avg_attrs(const char* op, const PoolOptions& o) {
  Attrs attrs = window_attrs(op, o);
  for (int64_t d : o.dilation)
    if (d != 1) fail<ValueError>("[{}] dilation {} is not supported", op, str(o.dilation));
  attrs.set("count_include_pad", o.count_include_pad);
  return attrs;
}

// Gradient ops: the forward input's spatial dims must be static to size their output (N and C
// may be dynamic: they are the gradient's).
Shape static_input_shape(const char* op, const Shape& input_shape) {
  for (size_t d = 2; d < input_shape.size(); ++d)
    if (input_shape[d] < 0)
      fail<ShapeError>("[{}] input_shape {} must have static spatial dims", op, str(input_shape));
  return input_shape;
}

// A stored node's window: one kernel size, stride and dilation per pooled dim, within bounds.
std::string check_stored_window(const InferContext& ctx) {
  const Attrs& a = ctx.attrs;
  const size_t nd = a.ints("kernel").size();
  std::string why;
  if (!(why = stored::check_ints(a, "kernel", nd, 1, stored::kMaxGeometry)).empty()) return why;
  for (const char* k : {"stride", "dilation"})
    if (!(why = stored::check_ints(a, k, nd, 1, stored::kMaxGeometry)).empty()) return why;
  return stored::check_ints(a, "pads", 2 * nd, 0, stored::kMaxGeometry);
}

// The NHWC inputs of channels_last nodes: x (dy), or max_pool_grad's dy and indices.
bool nhwc_first(const Attrs&, int k, int) { return k == 0; }
bool nhwc_dy_and_indices(const Attrs&, int k, int) { return k <= 1; }

}  // namespace

void register_pool_ops() {
  define_op(OpId::MaxPool)
      .set_infer(infer_max_pool)
      .grad(vjp_max_pool)
      .inputs(1)
      .check_stored(check_stored_window)
      .params<PoolParams>()
      .channels_last(nhwc_first);
  define_op(OpId::AvgPool)
      .set_infer(infer_avg_pool)
      .grad(vjp_avg_pool)
      .inputs(1)
      .check_stored(check_stored_window)
      .params<PoolParams>();
  define_op(OpId::AdaptiveAvgPool)
      .set_infer(infer_adaptive_avg_pool)
      .grad(vjp_adaptive_avg_pool)
      .inputs(1)
      .params<PoolParams>()
      .channels_last(nhwc_first);
  define_op(OpId::MaxPoolGrad)
      .set_infer(infer_max_pool_grad)
      .grad(vjp_max_pool_grad)
      .inputs(2)
      .from_values({"input_shape"})
      .params<PoolParams>()
      .channels_last(nhwc_dy_and_indices);
  define_op(OpId::AvgPoolGrad)
      .set_infer(infer_avg_pool_grad)
      .grad(vjp_avg_pool_grad)
      .inputs(1)
      .from_values({"input_shape"})
      .check_stored(check_stored_window)
      .params<PoolParams>();
  define_op(OpId::AdaptiveAvgPoolGrad)
      .set_infer(infer_adaptive_avg_pool_grad)
      .grad(vjp_adaptive_avg_pool_grad)
      .inputs(1)
      .from_values({"input_shape"})
      .params<PoolParams>()
      .channels_last(nhwc_first);
}

std::pair<Tensor, Tensor> max_pool_with_indices(const Tensor& x, const PoolOptions& opts) {
  Attrs attrs = window_attrs("max_pool", opts);
  attrs.set("dilation", per_dim("max_pool", "dilation", opts.dilation,
                                std::vector<int64_t>(opts.kernel.size(), 1)));
  auto outs = make_node(OpId::MaxPool, {x}, attrs);
  return {outs[0], outs[1]};
}

Tensor max_pool(const Tensor& x, const PoolOptions& opts) {
  return max_pool_with_indices(x, opts).first;
}

Tensor avg_pool(const Tensor& x, const PoolOptions& opts) {
  return make_node1(OpId::AvgPool, {x}, avg_attrs("avg_pool", opts));
}

Tensor adaptive_avg_pool(const Tensor& x, const std::vector<int64_t>& output_size) {
  if (output_size.empty() || output_size.size() > 3)
    fail<ValueError>("[adaptive_avg_pool] output_size {} must have 1 to 3 entries",
                     str(output_size));
  return make_node1(OpId::AdaptiveAvgPool, {x}, {{"output_size", output_size}});
}

Tensor global_avg_pool(const Tensor& x) {
  if (x.rank() < 3 || x.rank() > 5)
    fail<ShapeError>(
        "[global_avg_pool] input must have rank 3 to 5 (N, C, spatial...), got "
        "shape {}",
        str(x.shape()));
  return adaptive_avg_pool(x, std::vector<int64_t>(x.rank() - 2, 1));
}

Tensor max_pool_grad(const Tensor& grad, const Tensor& indices, const Shape& input_shape) {
  return make_node1(OpId::MaxPoolGrad, {grad, indices},
                    {{"input_shape", static_input_shape("max_pool_grad", input_shape)}});
}

Tensor avg_pool_grad(const Tensor& grad, const Shape& input_shape, const PoolOptions& opts) {
  Attrs attrs = avg_attrs("avg_pool_grad", opts);
  attrs.set("input_shape", static_input_shape("avg_pool_grad", input_shape));
  return make_node1(OpId::AvgPoolGrad, {grad}, attrs);
}

Tensor adaptive_avg_pool_grad(const Tensor& grad, const Shape& input_shape) {
  return make_node1(OpId::AdaptiveAvgPoolGrad, {grad},
                    {{"input_shape", static_input_shape("adaptive_avg_pool_grad", input_shape)}});
}

namespace {
// A pooling gradient whose input shape is a value: written in at once where it is a constant.
Tensor pool_grad_from_value(OpId op, const char* op_name, std::vector<Tensor> inputs, Attrs attrs,
                            const Tensor& input_shape) {
  if (!input_shape.valid()) fail<ValueError>("[{}] input_shape is an empty Tensor", op_name);
  if (!is_integer(input_shape.dtype()) || input_shape.rank() != 1 ||
      input_shape.dim(0) != inputs[0].rank())
    fail<ShapeError>(
        "[{}] the input_shape value must be 1-d integer with one entry per dim of "
        "the gradient {}, got {} {}",
        op_name, str(inputs[0].shape()), name(input_shape.dtype()), str(input_shape.shape()));
  if (const Array* v = constant_value(input_shape)) {
    attrs.set("input_shape", static_input_shape(op_name, v->astype(i64).to_vector<int64_t>()));
    return make_node1(op, inputs, std::move(attrs));
  }
  return node_from_values(op, std::move(inputs), std::move(attrs), {cast(input_shape, i64)});
}
}  // namespace

Tensor max_pool_grad(const Tensor& grad, const Tensor& indices, const Tensor& input_shape) {
  return pool_grad_from_value(OpId::MaxPoolGrad, "max_pool_grad", {grad, indices}, {}, input_shape);
}

Tensor avg_pool_grad(const Tensor& grad, const Tensor& input_shape, const PoolOptions& opts) {
  return pool_grad_from_value(OpId::AvgPoolGrad, "avg_pool_grad", {grad},
                              avg_attrs("avg_pool_grad", opts), input_shape);
}

Tensor adaptive_avg_pool_grad(const Tensor& grad, const Tensor& input_shape) {
  return pool_grad_from_value(OpId::AdaptiveAvgPoolGrad, "adaptive_avg_pool_grad", {grad}, {},
                              input_shape);
}

}  // namespace kiln
