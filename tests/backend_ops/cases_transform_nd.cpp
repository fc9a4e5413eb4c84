// Cases of the N-d indexing ops (gather_nd, scatter_nd).
#include <fmt/format.h>

#include <numeric>

#include "backend_ops/harness.h"

namespace kiln::harness {
namespace {

// Index tuples (..., m) for dims x[first, first + m): random in [-n, n), or, when `distinct`,
// each target at most once (a shuffled prefix of every target).
Gen tuples(const Shape& x, int64_t first, bool distinct, DType t) {
  return [x, first, distinct, t](const Shape& sh) {
    const int64_t m = sh.back(), count = numel(sh) / std::max<int64_t>(m, 1);
    std::vector<double> v(static_cast<size_t>(numel(sh)));
    std::vector<int64_t> order;
    if (distinct) {
      int64_t targets = 1;
      for (int64_t k = 0; k < m; ++k) targets *= x[first + k];
      order.resize(static_cast<size_t>(targets));
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), test::rng());
    }
    for (int64_t t = 0; t < count; ++t) {
      int64_t flat = distinct ? order[t % order.size()] : 0;
      for (int64_t k = m - 1; k >= 0; --k) {
        const int64_t n = x[first + k];
        if (distinct) {
          v[t * m + k] = static_cast<double>(flat % n - (t % 2 ? n : 0));  // negative for odd t
          flat /= n;
        } else {
          v[t * m + k] = static_cast<double>(
              std::uniform_int_distribution<int64_t>(-n, n - 1)(test::rng()));
        }
      }
    }
    return from_f64(v, sh, t);
  };
}

const bool kGatherNd = register_cases(
    {OpId::GatherNd, 6, [](Case& c, DType t, int i) {
       struct S {
         Shape x, idx;
         int64_t batch;
       };
       const S s[] = {{{257, 3}, {31, 1}, 0},      {{4, 33, 5}, {7, 2}, 0},
                      {{3, 17, 9}, {3, 11, 1}, 1}, {{2, 3, 5, 7}, {2, 3, 4, 2}, 2},
                      {{6, 4, 3}, {2, 2, 3}, 0},   {{5, 3}, {0, 1}, 0}};
       const DType it = i % 2 ? i32 : i64;
       Tensor idx = c.input(s[i].idx, it, tuples(s[i].x, s[i].batch, false, it));
       c.outs = {gather_nd(c.rand(s[i].x, t), idx, s[i].batch)};
       c.note(fmt::format("x {} indices {} batch_dims {}", to_string(s[i].x), to_string(s[i].idx),
                          s[i].batch));
       return true;
     }});

const bool kScatterNd = register_cases(
    {OpId::ScatterNd, 10, [](Case& c, DType t, int i) {
       const ScatterReduction red[] = {ScatterReduction::none, ScatterReduction::add,
                                       ScatterReduction::mul, ScatterReduction::max,
                                       ScatterReduction::min};
       const ScatterReduction r = red[(i + i / 5) % 5];  // each shape with two reductions
       struct S {
         Shape x, idx;
       };
       const S s[] = {{{257}, {31, 1}},
                      {{40, 129}, {33, 1}},
                      {{6, 7, 5}, {20, 2}},
                      {{3, 4, 5}, {2, 3, 3}},
                      {{6, 4}, {0, 1}}};
       const S& k = s[i % 5];
       Shape us(k.idx.begin(), k.idx.end() - 1);
       us.insert(us.end(), k.x.begin() + k.idx.back(), k.x.end());
       // none: distinct targets (the gradient check then sees every update win); reductions:
       // repeats welcome
       const DType it = i % 2 ? i32 : i64;
       Tensor idx = c.input(k.idx, it, tuples(k.x, 0, r == ScatterReduction::none, it));
       Tensor x = c.rand(k.x, t);
       Tensor upd = r == ScatterReduction::mul && is_floating(t) ? c.rand(us, t, 0.5, 1.5)
                                                                 : c.rand(us, t);
       c.outs = {scatter_nd(x, idx, upd, r)};
       c.tol_scale = 2;
       c.note(fmt::format("x {} indices {} reduction {}", to_string(k.x), to_string(k.idx),
                          static_cast<int>(r)));
       return true;
     }});

// The harness runs a case's graph several times over one variable, so only reductions that give
// the same variable when applied again (none, max, min) are compared here; add and mul are
// tested against a reference in tests/ops/test_transform_nd.cpp.
const bool kAssignScatterNd =
    register_cases({OpId::AssignScatterNd, 6, [](Case& c, DType t, int i) {
                      const ScatterReduction red[] = {ScatterReduction::none, ScatterReduction::max,
                                                      ScatterReduction::min};
                      const ScatterReduction r = red[i % 3];
                      struct S {
                        Shape x, idx;
                      };
                      const S s[] = {{{40, 129}, {33, 1}}, {{6, 7, 5}, {20, 2}}};
                      const S& k = s[i / 3];
                      Shape us(k.idx.begin(), k.idx.end() - 1);
                      us.insert(us.end(), k.x.begin() + k.idx.back(), k.x.end());
                      const DType it = i % 2 ? i32 : i64;
                      Tensor idx =
                          c.input(k.idx, it, tuples(k.x, 0, r == ScatterReduction::none, it));
                      Tensor v = c.variable(k.x, t);
                      c.outs = {assign_scatter_nd(v, idx, c.rand(us, t, 0, 6), r)};
                      c.note(fmt::format("variable {} indices {} reduction {}", to_string(k.x),
                                         to_string(k.idx), static_cast<int>(r)));
                      return true;
                    }});

// ---- resampling ----

const bool kResize = register_cases(
    {OpId::Resize, 8, [](Case& c, DType t, int i) {
       struct S {
         Shape x, out;
         ResizeMode mode;
         ResizeCoordinates coord;
         std::vector<double> scales;
       };
       using M = ResizeMode;
       using C = ResizeCoordinates;
       const S s[] = {{{2, 3, 17, 9}, {2, 3, 40, 5}, M::nearest, C::half_pixel, {}},
                      {{1, 2, 33, 31}, {1, 2, 64, 64}, M::linear, C::pytorch_half_pixel, {}},
                      {{2, 2, 9, 10}, {2, 2, 6, 23}, M::cubic, C::half_pixel, {}},
                      {{3, 5, 7}, {6, 5, 3}, M::linear, C::align_corners, {}},
                      {{2, 16, 12}, {2, 5, 30}, M::nearest, C::asymmetric, {1, 0.35, 2.5}},
                      {{1, 1, 12, 12}, {1, 1, 7, 9}, M::cubic, C::tf_crop_and_resize, {}},
                      {{257}, {100}, M::linear, C::half_pixel_symmetric, {0.39}},
                      {{2, 24, 20}, {2, 7, 6}, M::linear, C::half_pixel, {}}};
       const S& k = s[i];
       if (k.mode != M::nearest && !is_floating(t)) return false;
       ResizeOptions o;
       o.mode = k.mode;
       o.coordinate_transformation_mode = k.coord;
       o.scales = k.scales;
       o.nearest_mode = static_cast<NearestMode>(i % 4);
       o.exclude_outside = i == 2;
       o.antialias = i == 7;
       if (k.coord == C::tf_crop_and_resize) {
         o.roi = {0, 0, -0.2, 0.1, 1, 1, 0.9, 1.3};
         o.extrapolation_value = 0.5;
       }
       c.outs = {resize(c.rand(k.x, t), k.out, o)};
       c.note(fmt::format("x {} -> {} mode {} coord {}", to_string(k.x), to_string(k.out),
                          static_cast<int>(k.mode), static_cast<int>(k.coord)));
       return true;
     }});

const bool kGridSample = register_cases(
    {OpId::GridSample, 9, [](Case& c, DType t, int i) {
       struct S {
         Shape x, grid;
       };
       const S s[] = {{{2, 3, 17, 9}, {2, 5, 33, 2}}, {{1, 4, 7}, {1, 40, 1}},
                      {{1, 2, 4, 5, 6}, {1, 3, 7, 2, 3}}};
       const S& k = s[i % 3];
       GridSampleOptions o;
       o.mode = static_cast<GridSampleMode>(i % 3);
       o.padding_mode = static_cast<GridSamplePadding>(i / 3);
       o.align_corners = i % 2 == 1;
       // beyond [-1, 1] too, so the padding mode matters
       c.outs = {grid_sample(c.rand(k.x, t), c.rand(k.grid, t, -1.3, 1.3), o)};
       c.tol_scale = 2;
       c.note(fmt::format("x {} grid {} mode {} padding {} align {}", to_string(k.x),
                          to_string(k.grid), i % 3, i / 3, i % 2));
       return true;
     }});

}  // namespace
}  // namespace kiln::harness
