// Layout, lookup and selection ops of the transform family. Attrs:
//   depth_to_space, space_to_depth:  block_size, mode ("DCR" | "CRD"), channels_last; rank-4 x
//   embedding:       padding_idx (resolved to [0, num_embeddings), or -1 for none); inputs weight,
//                    indices (any integer dtype)
//   embedding_grad:  num_embeddings, padding_idx; inputs indices, grad (indices.shape + row shape)
//   masked_fill:     value; inputs x, mask (bool, broadcasts to x's shape)
//   roll:            shifts, axes (resolved, distinct; empty: x flattened, one shift)
//   non_max_suppression:  max_output_boxes_per_class, iou_threshold, has_score_threshold,
//                    score_threshold, center_point_box; inputs boxes (B, N, 4), scores (B, C, N)
//                    of one float dtype.
// non_max_suppression's output size depends on the data; kiln shapes are known at compile time,
// so it returns its largest possible result, selected (B * C * min(max, N), 3) i64, whose first
// `count` rows are the selection in ONNX order and the rest -1, and count, an i64 scalar. (The
// ONNX importer folds NonMaxSuppression on known inputs and slices the result to count.)
// depth_to_space, space_to_depth and roll are permutations: each one's gradient is its inverse.
// embedding's weight gradient is embedding_grad, a deterministic scatter-add of rows.
#include "kiln/ops/rearrange.h"

#include <algorithm>
#include <functional>
#include <map>

#include "core/sym_dim.h"
#include "kiln/autodiff.h"
#include "kiln/ops/core.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/transform.h"
#include "ops/common.h"
#include "ops/rearrange_params.h"
#include "ops/transform_util.h"

namespace kiln {

using namespace ops;

namespace {
constexpr int64_t kMaxBlock = int64_t{1} << 20;

bool crd_mode(const InferContext& ctx) {
  const std::string& m = ctx.attrs.str("mode");
  if (m != "DCR" && m != "CRD")
    fail<ValueError>("[{}] mode must be DCR or CRD, got '{}'", ctx.name(), m);
  return m == "CRD";
}

// dim * k (symbolic when dim is)
int64_t scaled(int64_t dim, int64_t k) { return sym::mul(dim, k); }

// (channel, height, width) dim positions of a rank-4 tensor in the op's layout.
struct Dims {
  int c, h, w;
};
Dims dims_of(const InferContext& ctx) {
  require_rank(ctx, 0, 4, 4);
  const int64_t b = ctx.attrs.i("block_size");
  if (b < 1 || b > kMaxBlock)
    fail<ValueError>("[{}] block_size {} must be in [1, {}] (x shape {})", ctx.name(), b, kMaxBlock,
                     str(ctx.inputs[0].shape));
  crd_mode(ctx);
  return ctx.attrs.b("channels_last") ? Dims{3, 1, 2} : Dims{1, 2, 3};
}

std::vector<TensorInfo> infer_depth_to_space(const InferContext& ctx) {
  const Dims d = dims_of(ctx);
  const Shape& x = ctx.inputs[0].shape;
  const int64_t b = ctx.attrs.i("block_size");
  if (x[d.c] >= 0 && x[d.c] % (b * b) != 0)
    fail<ShapeError>(
        "[depth_to_space] channels {} of x shape {} ({}) must divide by "
        "block_size^2 = {}",
        x[d.c], str(x), ctx.attrs.b("channels_last") ? "NHWC" : "NCHW", b * b);
  Shape out = x;
  out[d.c] = sym::floordiv(x[d.c], b * b);
  out[d.h] = scaled(x[d.h], b);
  out[d.w] = scaled(x[d.w], b);
  return {{out, ctx.inputs[0].dtype}};
}

std::vector<TensorInfo> infer_space_to_depth(const InferContext& ctx) {
  const Dims d = dims_of(ctx);
  const Shape& x = ctx.inputs[0].shape;
  const int64_t b = ctx.attrs.i("block_size");
  if ((x[d.h] >= 0 && x[d.h] % b != 0) || (x[d.w] >= 0 && x[d.w] % b != 0))
    fail<ShapeError>(
        "[space_to_depth] height and width of x shape {} ({}) must divide by "
        "block_size {}",
        str(x), ctx.attrs.b("channels_last") ? "NHWC" : "NCHW", b);
  Shape out = x;
  out[d.c] = scaled(x[d.c], b * b);
  out[d.h] = sym::floordiv(x[d.h], b);
  out[d.w] = sym::floordiv(x[d.w], b);
  return {{out, ctx.inputs[0].dtype}};
}

// padding_idx must be -1 (none) or a row of a table of `rows` rows (unknown: -1).
void check_padding_idx(const InferContext& ctx, int64_t pad, int64_t rows) {
  if (pad < -1 || (rows >= 0 && pad >= rows))
    fail<ValueError>("[{}] padding_idx {} is not a row of a table of {} rows", ctx.name(), pad,
                     rows);
}

std::vector<TensorInfo> infer_embedding(const InferContext& ctx) {
  const TensorInfo &w = ctx.inputs[0], &idx = ctx.inputs[1];
  if (w.shape.empty())
    fail<ShapeError>("[embedding] weight must have rank >= 1 (num_embeddings, ...), got shape {}",
                     str(w.shape));
  require_dtype(ctx, 1, kIntTypes, "an integer dtype for indices");
  check_padding_idx(ctx, ctx.attrs.i("padding_idx"), w.shape[0]);
  Shape out = idx.shape;
  out.insert(out.end(), w.shape.begin() + 1, w.shape.end());
  return {{out, w.dtype}};
}

std::vector<TensorInfo> infer_embedding_grad(const InferContext& ctx) {
  const TensorInfo &idx = ctx.inputs[0], &g = ctx.inputs[1];
  require_dtype(ctx, 0, kIntTypes, "an integer dtype for indices");
  require_dtype(ctx, 1, kFloatTypes, "a float dtype for grad");
  const int64_t rows = ctx.attrs.i("num_embeddings");
  if (rows < 0) fail<ValueError>("[embedding_grad] num_embeddings {} is negative", rows);
  check_padding_idx(ctx, ctx.attrs.i("padding_idx"), rows);
  const Shape lead(g.shape.begin(), g.shape.begin() + std::min(g.shape.size(), idx.shape.size()));
  if (g.shape.size() < idx.shape.size() || !shapes_match(lead, idx.shape))
    fail<ShapeError>("[embedding_grad] grad shape {} must start with indices shape {}",
                     str(g.shape), str(idx.shape));
  Shape out{rows};
  out.insert(out.end(), g.shape.begin() + static_cast<int64_t>(idx.shape.size()), g.shape.end());
  return {{out, g.dtype}};
}

std::vector<TensorInfo> infer_masked_fill(const InferContext& ctx) {
  const TensorInfo &x = ctx.inputs[0], &m = ctx.inputs[1];
  require_dtype(ctx, 1, DTypeSet{boolean}, "bool for mask");
  Shape b;
  if (m.shape.size() > x.shape.size() || !broadcast_shapes(x.shape, m.shape, b) ||
      !shapes_match(b, x.shape))
    fail<ShapeError>("[masked_fill] mask shape {} does not broadcast to x shape {}", str(m.shape),
                     str(x.shape));
  return {x};
}

std::vector<TensorInfo> infer_roll(const InferContext& ctx) {
  const Shape& x = ctx.inputs[0].shape;
  const auto &shifts = ctx.attrs.ints("shifts"), &axes = ctx.attrs.ints("axes");
  if (axes.empty() ? shifts.size() != 1 : shifts.size() != axes.size())
    fail<ValueError>(
        "[roll] {} shifts for {} axes (x shape {}): one per axis, or one shift "
        "with no axes",
        shifts.size(), axes.size(), str(x));
  const int64_t r = static_cast<int64_t>(x.size());
  for (size_t k = 0; k < axes.size(); ++k) {
    if (axes[k] < 0 || axes[k] >= r)
      fail<ValueError>("[roll] axis {} is out of range for shape {}", axes[k], str(x));
    for (size_t j = 0; j < k; ++j)
      if (axes[j] == axes[k]) fail<ValueError>("[roll] axis {} appears twice", axes[k]);
  }
  return {ctx.inputs[0]};
}

std::vector<TensorInfo> infer_nms(const InferContext& ctx) {
  const TensorInfo &boxes = ctx.inputs[0], &scores = ctx.inputs[1];
  require_dtype(ctx, 0, kFloatTypes, "a float dtype for boxes");
  const Shape &bs = boxes.shape, &ss = scores.shape;
  if (bs.size() != 3 || !dims_match(bs[2], 4) || ss.size() != 3 || !dims_match(bs[0], ss[0]) ||
      !dims_match(bs[1], ss[2]))
    fail<ShapeError>(
        "[non_max_suppression] boxes shape {} must be (B, N, 4) and scores shape {} "
        "(B, C, N)",
        str(bs), str(ss));
  if (scores.dtype != boxes.dtype)
    fail<DTypeError>("[non_max_suppression] scores dtype {} differs from boxes dtype {}",
                     name(scores.dtype), name(boxes.dtype));
  const int64_t m = ctx.attrs.i("max_output_boxes_per_class");
  if (m < 0) fail<ValueError>("[non_max_suppression] max_output_boxes_per_class {} is negative", m);
  const double iou = ctx.attrs.f("iou_threshold");
  if (!(iou >= 0 && iou <= 1))
    fail<ValueError>("[non_max_suppression] iou_threshold {} is not in [0, 1]", iou);
  const int64_t b = bs[0] >= 0 ? bs[0] : ss[0], n = bs[1] >= 0 ? bs[1] : ss[2];
  const int64_t rows = b < 0 || ss[1] < 0 || n < 0 ? -1 : b * ss[1] * std::min(m, n);
  return {{{rows, 3}, i64}, {{}, i64}};
}

// ---- gradient rules (written with kiln ops, so they are differentiable themselves)

using Grads = std::vector<std::optional<Tensor>>;

SpaceDepthOptions options_of(const Attrs& a) {
  return {a.str("mode") == "CRD" ? SpaceDepthMode::crd : SpaceDepthMode::dcr, a.b("channels_last")};
}

Grads vjp_depth_to_space(const VjpContext& c) {
  return {space_to_depth(*c.cotangents[0], c.attrs.i("block_size"), options_of(c.attrs))};
}

Grads vjp_space_to_depth(const VjpContext& c) {
  return {depth_to_space(*c.cotangents[0], c.attrs.i("block_size"), options_of(c.attrs))};
}

Grads vjp_embedding(const VjpContext& c) {
  const int64_t rows = transform::static_input_shape(c, 0)[0];
  return {embedding_grad(c.inputs[1], *c.cotangents[0], rows, c.attrs.i("padding_idx")),
          std::nullopt};
}

// embedding_grad is linear in grad: its transpose reads the rows back (none for padding).
Grads vjp_embedding_grad(const VjpContext& c) {
  const Tensor& idx = c.inputs[0];
  Tensor g = embedding(*c.cotangents[0], idx);
  if (const int64_t pad = c.attrs.i("padding_idx"); pad >= 0) {
    std::vector<int64_t> tail;
    for (int k = idx.rank(); k < g.rank(); ++k) tail.push_back(k);
    const Tensor is_pad = equal(cast(idx, i64), scalar_like(cast(idx, i64), double(pad)));
    g = masked_fill(g, tail.empty() ? is_pad : expand_dims(is_pad, tail), 0);
  }
  return {std::nullopt, g};
}

Grads vjp_masked_fill(const VjpContext& c) {
  return {masked_fill(*c.cotangents[0], c.inputs[1], 0), std::nullopt};
}

Grads vjp_roll(const VjpContext& c) {
  std::vector<int64_t> back = c.attrs.ints("shifts");
  for (auto& s : back) s = -s;
  return {roll(*c.cotangents[0], back, c.attrs.ints("axes"))};
}

Attrs space_depth_attrs(int64_t b, const SpaceDepthOptions& o) {
  return {{"block_size", b},
          {"mode", std::string(o.mode == SpaceDepthMode::crd ? "CRD" : "DCR")},
          {"channels_last", o.channels_last}};
}

// pixel_shuffle / pixel_unshuffle: x (*, C, H, W) as rank 4, `f` applied, leading dims back.
Tensor with_leading_dims(const char* op, const Tensor& x,
                         const std::function<Tensor(const Tensor&)>& f) {
  const int r = x.rank();
  if (r < 3)
    fail<ShapeError>("[{}] x must have rank >= 3 (*, C, H, W), got shape {}", op, str(x.shape()));
  if (r == 4) return f(x);
  if (r == 3) return squeeze(f(expand_dims(x, {0})), {0});
  const Shape s = x.shape();
  Shape lead(s.begin(), s.end() - 3);
  if (!is_static(lead))
    fail<ShapeError>("[{}] leading dims of x shape {} must be static", op, str(s));
  const Tensor y = f(reshape(x, {numel(lead), s[r - 3], s[r - 2], s[r - 1]}));
  const Shape ys = y.shape();
  lead.insert(lead.end(), ys.begin() + 1, ys.end());
  return reshape(y, lead);
}
}  // namespace

void register_rearrange_ops() {
  define_op(OpId::DepthToSpace)
      .set_infer(infer_depth_to_space)
      .grad(vjp_depth_to_space)
      .inputs(1)
      .params<SpaceDepthParams>();
  define_op(OpId::SpaceToDepth)
      .set_infer(infer_space_to_depth)
      .grad(vjp_space_to_depth)
      .inputs(1)
      .params<SpaceDepthParams>();
  define_op(OpId::Embedding).set_infer(infer_embedding).grad(vjp_embedding).inputs(2);
  define_op(OpId::EmbeddingGrad)
      .set_infer(infer_embedding_grad)
      .grad(vjp_embedding_grad)
      .inputs(2)
      .params<EmbeddingGradParams>();
  define_op(OpId::MaskedFill)
      .set_infer(infer_masked_fill)
      .grad(vjp_masked_fill)
      .inputs(2)
      .params<MaskedFillParams>();
  define_op(OpId::Roll).set_infer(infer_roll).grad(vjp_roll).inputs(1).params<RollParams>();
  define_op(OpId::NonMaxSuppression)
      .set_infer(infer_nms)
      .not_differentiable()
      .inputs(2)
      .params<NonMaxSuppressionParams>();
}

Tensor depth_to_space(const Tensor& x, int64_t block_size, const SpaceDepthOptions& o) {
  return make_node1(OpId::DepthToSpace, {x}, space_depth_attrs(block_size, o));
}

Tensor space_to_depth(const Tensor& x, int64_t block_size, const SpaceDepthOptions& o) {
  return make_node1(OpId::SpaceToDepth, {x}, space_depth_attrs(block_size, o));
}

Tensor pixel_shuffle(const Tensor& x, int64_t upscale_factor) {
  return with_leading_dims("pixel_shuffle", x, [&](const Tensor& t) {
    return depth_to_space(t, upscale_factor, {SpaceDepthMode::crd, false});
  });
}

Tensor pixel_unshuffle(const Tensor& x, int64_t downscale_factor) {
  return with_leading_dims("pixel_unshuffle", x, [&](const Tensor& t) {
    return space_to_depth(t, downscale_factor, {SpaceDepthMode::crd, false});
  });
}

Tensor embedding(const Tensor& weight, const Tensor& indices, std::optional<int64_t> padding_idx) {
  int64_t pad = -1;
  if (padding_idx) {
    const int64_t rows = weight.rank() > 0 ? weight.dim(0) : 0;
    pad = *padding_idx;
    if (pad < 0 && rows >= 0) pad += rows;
    if (pad < 0 || (rows >= 0 && pad >= rows))
      fail<ValueError>("[embedding] padding_idx {} is not a row of weight shape {}", *padding_idx,
                       str(weight.shape()));
  }
  return make_node1(OpId::Embedding, {weight, indices}, {{"padding_idx", pad}});
}

Tensor embedding_grad(const Tensor& indices, const Tensor& grad, int64_t num_embeddings,
                      int64_t padding_idx) {
  return make_node1(OpId::EmbeddingGrad, {indices, grad},
                    {{"num_embeddings", num_embeddings}, {"padding_idx", padding_idx}});
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  return make_node1(OpId::MaskedFill, {x, mask}, {{"value", value}});
}

Tensor roll(const Tensor& x, const std::vector<int64_t>& shifts, const std::vector<int64_t>& axes) {
  if (axes.empty() ? shifts.size() != 1 : shifts.size() != axes.size())
    fail<ValueError>(
        "[roll] {} shifts for {} axes (x shape {}): one per axis, or one shift "
        "with no axes",
        shifts.size(), axes.size(), str(x.shape()));
  // repeated axes add up (PyTorch), so the node holds each axis once
  std::map<int64_t, int64_t> by_axis;
  for (size_t k = 0; k < axes.size(); ++k)
    by_axis[resolve_axis("roll", axes[k], x.shape())] += shifts[k];
  std::vector<int64_t> s = axes.empty() ? shifts : std::vector<int64_t>{}, a;
  for (auto [axis, shift] : by_axis) {
    a.push_back(axis);
    s.push_back(shift);
  }
  return make_node1(OpId::Roll, {x}, {{"shifts", s}, {"axes", a}});
}

std::pair<Tensor, Tensor> non_max_suppression(const Tensor& boxes, const Tensor& scores,
                                              int64_t max_output_boxes_per_class,
                                              const NonMaxSuppressionOptions& o) {
  auto outs = make_node(OpId::NonMaxSuppression, {boxes, cast_to(scores, boxes.dtype())},
                        {{"max_output_boxes_per_class", max_output_boxes_per_class},
                         {"iou_threshold", o.iou_threshold},
                         {"has_score_threshold", o.score_threshold.has_value()},
                         {"score_threshold", o.score_threshold.value_or(0.0)},
                         {"center_point_box", o.center_point_box}});
  return {outs[0], outs[1]};
}

}  // namespace kiln
