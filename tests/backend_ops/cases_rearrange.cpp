// Cases of the layout, lookup and selection ops (depth_to_space, space_to_depth, embedding,
// embedding_grad, masked_fill, roll, non_max_suppression).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backend_ops/harness.h"

namespace kiln::harness {
namespace {

struct SpaceDepthCase {
  int64_t n, c, h, w, b;
  SpaceDepthMode mode;
  bool nhwc;
};
const SpaceDepthCase kSpaceDepth[] = {
    {2, 3, 17, 9, 2, SpaceDepthMode::dcr, false}, {1, 5, 8, 33, 3, SpaceDepthMode::crd, false},
    {2, 16, 7, 5, 2, SpaceDepthMode::dcr, true},  {1, 3, 9, 4, 4, SpaceDepthMode::crd, true},
    {3, 1, 1, 1, 1, SpaceDepthMode::dcr, false},  {1, 2, 0, 3, 2, SpaceDepthMode::crd, false}};
constexpr int kNumSpaceDepth = static_cast<int>(std::size(kSpaceDepth));

Shape depth_shape(const SpaceDepthCase& k) {
  const int64_t dc = k.c * k.b * k.b;
  return k.nhwc ? Shape{k.n, k.h, k.w, dc} : Shape{k.n, dc, k.h, k.w};
}
Shape space_shape(const SpaceDepthCase& k) {
  return k.nhwc ? Shape{k.n, k.h * k.b, k.w * k.b, k.c} : Shape{k.n, k.c, k.h * k.b, k.w * k.b};
}
std::string label(const SpaceDepthCase& k, const Shape& x) {
  return fmt::format("x {} block {} {} {}", to_string(x), k.b,
                     k.mode == SpaceDepthMode::crd ? "CRD" : "DCR", k.nhwc ? "NHWC" : "NCHW");
}

const bool kDepthToSpace =
    register_cases({OpId::DepthToSpace, kNumSpaceDepth, [](Case& c, DType t, int i) {
                      const SpaceDepthCase& k = kSpaceDepth[i];
                      c.outs = {depth_to_space(c.rand(depth_shape(k), t), k.b, {k.mode, k.nhwc})};
                      c.note(label(k, depth_shape(k)));
                      return true;
                    }});

const bool kSpaceToDepth =
    register_cases({OpId::SpaceToDepth, kNumSpaceDepth, [](Case& c, DType t, int i) {
                      const SpaceDepthCase& k = kSpaceDepth[i];
                      c.outs = {space_to_depth(c.rand(space_shape(k), t), k.b, {k.mode, k.nhwc})};
                      c.note(label(k, space_shape(k)));
                      return true;
                    }});

struct EmbeddingCase {
  Shape w, idx;
  int64_t pad;
};
const EmbeddingCase kEmbeddings[] = {
    {{50, 64}, {7, 33}, -1}, {{9, 3, 5}, {40}, 4}, {{1000, 129}, {257}, 0}, {{5, 1}, {3, 0}, -1}};
constexpr int kNumEmbeddings = static_cast<int>(std::size(kEmbeddings));

const bool kEmbedding = register_cases(
    {OpId::Embedding, kNumEmbeddings, [](Case& c, DType t, int i) {
       const EmbeddingCase& k = kEmbeddings[i];
       const DType it = i % 2 ? i32 : i64;
       Tensor idx = c.ints(k.idx, 0, k.w[0] - 1, it);
       c.outs = {embedding(c.rand(k.w, t), idx,
                           k.pad < 0 ? std::nullopt : std::optional<int64_t>(k.pad))};
       c.note(fmt::format("weight {} indices {} padding_idx {}", to_string(k.w), to_string(k.idx),
                          k.pad));
       return true;
     }});

const bool kEmbeddingGrad =
    register_cases({OpId::EmbeddingGrad, kNumEmbeddings, [](Case& c, DType t, int i) {
                      const EmbeddingCase& k = kEmbeddings[i];
                      Tensor idx = c.ints(k.idx, 0, k.w[0] - 1, i % 2 ? i32 : i64);
                      Shape gs = k.idx;
                      gs.insert(gs.end(), k.w.begin() + 1, k.w.end());
                      c.outs = {embedding_grad(idx, c.rand(gs, t), k.w[0], k.pad)};
                      c.tol_scale = 4;  // rows sum many gradients
                      c.note(fmt::format("rows {} indices {} grad {} padding_idx {}", k.w[0],
                                         to_string(k.idx), to_string(gs), k.pad));
                      return true;
                    }});

const bool kMaskedFill = register_cases(
    {OpId::MaskedFill, 5, [](Case& c, DType t, int i) {
       struct S {
         Shape x, mask;
         Layout l;
       };
       const S s[] = {{{33, 129}, {33, 129}, Layout::dense},
                      {{4, 17, 9}, {17, 1}, Layout::dense},
                      {{5, 128}, {5, 128}, Layout::transposed},
                      {{3, 7}, {}, Layout::dense},
                      {{2, 0, 3}, {3}, Layout::dense}};
       const double value = t == boolean ? 1 : is_floating(t) ? -1.75 : 3;
       c.outs = {masked_fill(c.rand(s[i].x, t, s[i].l), c.rand(s[i].mask, boolean), value)};
       c.note(fmt::format("x {} mask {}", to_string(s[i].x), to_string(s[i].mask)));
       return true;
     }});

const bool kRoll =
    register_cases({OpId::Roll, 5, [](Case& c, DType t, int i) {
                      struct S {
                        Shape x;
                        std::vector<int64_t> shifts, axes;
                      };
                      const S s[] = {{{257}, {100}, {0}},
                                     {{33, 65}, {-7, 70}, {0, 1}},
                                     {{4, 5, 129}, {1000}, {}},
                                     {{3, 4, 5, 6}, {1, -1, 2}, {0, 2, 3}},
                                     {{6, 0}, {3}, {0}}};
                      c.outs = {roll(c.rand(s[i].x, t), s[i].shifts, s[i].axes)};
                      c.note(fmt::format("x {} shifts [{}] axes [{}]", to_string(s[i].x),
                                         fmt::join(s[i].shifts, ","), fmt::join(s[i].axes, ",")));
                      return true;
                    }});

// Boxes in a 10 x 10 field, sizes 0.5 to 4 (corners in either order, or centers), so that many
// overlap.
Gen boxes_gen(DType t, bool center) {
  return [t, center](const Shape& sh) {
    std::uniform_real_distribution<double> pos(0, 10), size(0.5, 4);
    std::vector<double> v;
    for (int64_t i = 0; i < numel(sh) / 4; ++i) {
      const double y = pos(test::rng()), x = pos(test::rng()), h = size(test::rng()),
                   w = size(test::rng());
      if (center) v.insert(v.end(), {x, y, w, h});
      else if (i % 2) v.insert(v.end(), {y + h, x + w, y, x});
      else v.insert(v.end(), {y, x, y + h, x + w});
    }
    return from_f64(v, sh, t);
  };
}

const bool kNonMaxSuppression =
    register_cases({OpId::NonMaxSuppression, 4, [](Case& c, DType t, int i) {
                      struct S {
                        int64_t b, cls, n, max_out;
                        double iou;
                        std::optional<double> score;
                        bool center;
                      };
                      const S s[] = {{1, 1, 300, 50, 0.5, std::nullopt, false},
                                     {2, 5, 64, 10, 0.3, 0.25, true},
                                     {3, 2, 1000, 1000, 0.6, 0.1, false},
                                     {2, 3, 0, 4, 0.5, std::nullopt, false}};
                      const S& k = s[i];
                      NonMaxSuppressionOptions o;
                      o.iou_threshold = k.iou;
                      o.score_threshold = k.score;
                      o.center_point_box = k.center;
                      Tensor boxes = c.input({k.b, k.n, 4}, t, boxes_gen(t, k.center));
                      auto [sel, count] = non_max_suppression(
                          boxes, c.rand({k.b, k.cls, k.n}, t, 0, 1), k.max_out, o);
                      c.outs = {sel, count};
                      c.note(fmt::format("B {} C {} N {} max {} iou {}{}", k.b, k.cls, k.n,
                                         k.max_out, k.iou, k.center ? " center" : ""));
                      return true;
                    }});

}  // namespace
}  // namespace kiln::harness
