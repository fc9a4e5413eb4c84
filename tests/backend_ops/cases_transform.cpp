// Cases of the reductions, transforms, indexing and sorting ops.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <numeric>

#include "backend_ops/harness.h"

namespace kiln::harness {
namespace {

constexpr Layout kDense = Layout::dense, kT = Layout::transposed, kS = Layout::strided;

std::string layout_name(Layout l) { return l == kT ? " transposed" : l == kS ? " strided" : ""; }

// ---- reductions ----

struct ReduceCase {
  Shape x;
  Axes axes;
  bool keepdims;
  Layout l;
  bool empty_reduction;  // reduces over an empty axis (ops without identity skip it)
};
const ReduceCase kReduces[] = {
    {{257}, {}, false, kDense, false},
    {{3, 255}, {-1}, true, kDense, false},
    {{33, 129}, {0}, false, kDense, false},
    {{4, 31, 32}, {0, 2}, false, kDense, false},
    {{5, 128}, {1}, false, kT, false},
    {{2, 3, 5}, {}, true, kDense, false},
    {{256}, {0}, false, kS, false},
    {{7, 0}, {1}, false, kDense, true},
    {{0, 7}, {1}, true, kDense, false},
    {{2, 513}, {1}, false, kDense, false},
    {{6, 5}, {1}, false, kDense, false},  // at most 8 elements: a thread per output
    // several thread blocks per reduction
    {{65537}, {}, false, kDense, false},
    {{3, 4099}, {1}, false, kDense, false},
    {{4099, 3}, {0}, false, kDense, false},
};
constexpr int kNumReduces = static_cast<int>(std::size(kReduces));

using ReduceFn = std::function<Tensor(const Tensor&, const Axes&, bool, int)>;

void reduction(OpId op, ReduceFn f, double lo, double hi, bool has_identity,
               bool nan_case = false) {
  register_cases(
      {op, kNumReduces + nan_case, [=](Case& c, DType t, int i) {
         if (i == kNumReduces) {  // NaN propagation
           if (!is_floating(t)) return false;
           c.outs = {f(c.input({5, 129}, t, with_nans(t, uniform(t, lo, hi))), {1}, false, i)};
           c.grad = false;
           c.note("NaNs, x (5, 129) axes [1]");
           return true;
         }
         const ReduceCase& k = kReduces[i];
         if (k.empty_reduction && !has_identity) return false;
         Tensor x = is_floating(t) ? c.rand(k.x, t, lo, hi, k.l) : c.rand(k.x, t, k.l);
         c.outs = {f(x, k.axes, k.keepdims, i)};
         c.tol_scale = 4;
         c.note(fmt::format("x {}{} axes [{}]{}", to_string(k.x), layout_name(k.l),
                            fmt::join(k.axes, ","), k.keepdims ? " keepdims" : ""));
         return true;
       }});
}

template <Tensor (*F)(const Tensor&, const Axes&, bool)>
Tensor reduce_plain(const Tensor& x, const Axes& a, bool k, int) {
  return F(x, a, k);
}

const bool kReductions = [] {
  reduction(OpId::Sum, reduce_plain<sum>, -1, 1, true);
  reduction(OpId::Mean, reduce_plain<mean>, -1, 1, true);
  reduction(OpId::Max, reduce_plain<max>, -1, 1, false, true);
  reduction(OpId::Min, reduce_plain<min>, -1, 1, false, true);
  reduction(OpId::Prod, reduce_plain<prod>, 0.98, 1.02, true);
  reduction(OpId::Logsumexp, reduce_plain<logsumexp>, -3, 3, true);
  reduction(
      OpId::Variance,
      [](const Tensor& x, const Axes& a, bool k, int i) { return variance(x, a, k, i % 2); }, -1, 2,
      true);
  reduction(OpId::NormL1, reduce_plain<norm_l1>, -1, 1, true);
  reduction(OpId::NormL2, reduce_plain<norm_l2>, -1, 1, true);
  return true;
}();

// Argmax/argmin along the last fed axis, over values distinct along it.
void arg_reduction(OpId op, Tensor (*f)(const Tensor&, int64_t, bool)) {
  register_cases({op, 9, [f](Case& c, DType t, int i) {
                    struct S {
                      Shape x;
                      int64_t axis;
                      bool keepdims;
                      Layout l;
                    };
                    const S s[] = {{{257}, 0, false, kDense},       {{3, 255}, -1, true, kDense},
                                   {{4, 31, 33}, 2, false, kDense}, {{128, 5}, 0, false, kT},
                                   {{7, 0, 129}, 2, false, kDense}, {{2, 32}, 1, true, kDense},
                                   {{2, 4097}, 1, false, kDense},   {{6, 5}, 1, true, kDense},
                                   {{3, 8200}, 1, false, kDense}};  // split, partials merged
                    // f16 holds 4097 distinct values, bf16 only 513; over 8200 both have ties,
                    // where the first occurrence wins on every backend
                    if (i == 6 && t == bf16) return false;
                    c.outs = {f(c.distinct(s[i].x, t, s[i].l), s[i].axis, s[i].keepdims)};
                    c.note(fmt::format("x {}{} axis {}{}", to_string(s[i].x), layout_name(s[i].l),
                                       s[i].axis, s[i].keepdims ? " keepdims" : ""));
                    return true;
                  }});
}

const bool kArgs = [] {
  arg_reduction(OpId::Argmax, argmax);
  arg_reduction(OpId::Argmin, argmin);
  return true;
}();

const bool kCumsum = register_cases(
    {OpId::Cumsum, 10, [](Case& c, DType t, int i) {
       struct S {
         Shape x;
         int64_t axis;
         Layout l;
       };
       const S s[] = {{{257}, 0, kDense},     {{3, 255}, -1, kDense},   {{33, 129}, 0, kDense},
                      {{5, 128}, 1, kT},      {{4, 31, 32}, 1, kDense}, {{0, 7}, 1, kDense},
                      {{3, 5000}, 1, kDense}, {{20000}, 0, kDense},      // multi-block scans
                      {{130, 3}, 0, kDense},  {{2, 97, 4}, 1, kDense}};  // chunked columns
       const bool exclusive = i % 2, reverse = i % 3 == 1;
       c.outs = {cumsum(c.rand(s[i].x, t, s[i].l), s[i].axis, exclusive, reverse)};
       c.tol_scale = 4;
       c.note(fmt::format("x {}{} axis {}{}{}", to_string(s[i].x), layout_name(s[i].l), s[i].axis,
                          exclusive ? " exclusive" : "", reverse ? " reverse" : ""));
       return true;
     }});

// ---- layout transforms ----

const bool kReshape =
    register_cases({OpId::Reshape, 4, [](Case& c, DType t, int i) {
                      struct S {
                        Shape x, to;
                        Layout l;
                      };
                      const S s[] = {{{33, 65}, {65, 33}, kT},
                                     {{4, 128}, {-1}, kS},
                                     {{2, 3, 257}, {6, 257, 1}, kT},
                                     {{0, 5}, {5, 0}, kT}};
                      c.outs = {reshape(c.rand(s[i].x, t, s[i].l), s[i].to)};
                      c.note(fmt::format("{}{} to {}", to_string(s[i].x), layout_name(s[i].l),
                                         to_string(s[i].to)));
                      return true;
                    }});

const bool kTranspose = register_cases(
    {OpId::Transpose, 7, [](Case& c, DType t, int i) {
       struct S {
         Shape x;
         std::vector<int64_t> perm;
       };
       const S s[] = {{{33, 65}, {}},           {{31, 257}, {1, 0}},
                      {{4, 33, 17}, {2, 0, 1}}, {{2, 3, 31, 5}, {0, 2, 1, 3}},
                      {{128, 3, 2}, {1, 2, 0}}, {{0, 4}, {1, 0}},
                      {{2, 3, 33, 35}, {0, 2, 3, 1}}};  // NCHW -> NHWC, 3 channels
       c.outs = {transpose(c.rand(s[i].x, t), s[i].perm)};
       c.note(fmt::format("{} perm [{}]", to_string(s[i].x), fmt::join(s[i].perm, ",")));
       return true;
     }});

const bool kSplit = register_cases(
    {OpId::Split, 5, [](Case& c, DType t, int i) {
       switch (i) {
         case 0:
           c.outs = split(c.rand({4, 129}, t), 3, 1);
           break;
         case 1:
           c.outs = split(c.rand({257, 3}, t), std::vector<int64_t>{1, 128, 128}, 0);
           break;
         case 2:
           c.outs = split(c.rand({33, 64}, t, kT), std::vector<int64_t>{31, 0, 2}, 0);
           break;
         case 3:
           c.outs = split(c.rand({2, 6, 5}, t, kS), 3, 1);
           break;
         default:
           c.outs = split(c.rand({0, 6}, t), 2, 1);
           break;
       }
       c.note("split variant " + std::to_string(i));
       return true;
     }});

const bool kConcat = register_cases(
    {OpId::Concat, 5, [](Case& c, DType t, int i) {
       switch (i) {
         case 0:
           c.outs = {concat({c.rand({3, 31}, t), c.rand({3, 33}, t)}, 1)};
           break;
         case 1:
           c.outs = {concat({c.rand({128, 4}, t), c.rand({1, 4}, t), c.rand({128, 4}, t)}, 0)};
           break;
         case 2:
           c.outs = {concat({c.rand({17, 33}, t, kT), c.rand({17, 2}, t, kS)}, -1)};
           break;
         case 3:
           c.outs = {concat({c.rand({2, 0, 3}, t), c.rand({2, 5, 3}, t)}, 1)};
           break;
         default:
           c.outs = {concat({c.rand({2, 3, 5}, t), c.rand({2, 3, 5}, t)}, 2)};
           break;
       }
       c.note("concat variant " + std::to_string(i));
       return true;
     }});

const bool kSlice = register_cases(
    {OpId::Slice, 6, [](Case& c, DType t, int i) {
       struct S {
         Shape x;
         std::vector<int64_t> starts, stops, steps, axes;
         Layout l;
       };
       const S s[] = {{{257}, {1}, {256}, {}, {}, kDense},
                      {{33, 65}, {2, -40}, {31, 100}, {3, 2}, {}, kDense},
                      {{4, 129}, {-1}, {-130}, {-2}, {1}, kDense},
                      {{3, 31, 17}, {5, 1}, {30, 16}, {1, 4}, {1, 2}, kT},
                      {{8, 8}, {4}, {4}, {}, {0}, kDense},
                      {{5, 6}, {0, 0}, {5, 6}, {1, 1}, {}, kS}};
       c.outs = {slice(c.rand(s[i].x, t, s[i].l), s[i].starts, s[i].stops, s[i].steps, s[i].axes)};
       c.note(fmt::format("x {}{} starts [{}] stops [{}] steps [{}] axes [{}]", to_string(s[i].x),
                          layout_name(s[i].l), fmt::join(s[i].starts, ","),
                          fmt::join(s[i].stops, ","), fmt::join(s[i].steps, ","),
                          fmt::join(s[i].axes, ",")));
       return true;
     }});

const bool kPad = register_cases(
    {OpId::Pad, 7, [](Case& c, DType t, int i) {
       struct S {
         Shape x;
         std::vector<int64_t> pads;
         PadKind kind;
         Layout l;
       };
       const S s[] = {{{31}, {1, 2}, PadKind::constant, kDense},
                      {{33, 65}, {2, 0, 1, 3}, PadKind::reflect, kDense},
                      {{4, 127}, {1, 1, 2, 2}, PadKind::edge, kDense},
                      {{17, 9}, {-2, 3, 0, -1}, PadKind::constant, kT},
                      {{3, 5, 6}, {0, 0, 4, 4, 5, 0}, PadKind::reflect, kS},
                      {{0, 4}, {1, 1, 0, 0}, PadKind::constant, kDense},
                      {{2, 3}, {0, 0, 2, 1}, PadKind::edge, kDense}};
       c.outs = {pad(c.rand(s[i].x, t, s[i].l), s[i].pads, s[i].kind, t == boolean ? 1 : 2.5)};
       c.note(fmt::format("x {}{} pads [{}] kind {}", to_string(s[i].x), layout_name(s[i].l),
                          fmt::join(s[i].pads, ","), static_cast<int>(s[i].kind)));
       return true;
     }});

const bool kTile =
    register_cases({OpId::Tile, 5, [](Case& c, DType t, int i) {
                      struct S {
                        Shape x;
                        std::vector<int64_t> reps;
                        Layout l;
                      };
                      const S s[] = {{{31}, {3}, kDense},
                                     {{3, 33}, {2, 4}, kDense},
                                     {{17, 5}, {2, 1, 3}, kT},
                                     {{4, 2, 3}, {2}, kS},
                                     {{0, 3}, {3, 2}, kDense}};
                      c.outs = {tile(c.rand(s[i].x, t, s[i].l), s[i].reps)};
                      c.note(fmt::format("x {}{} reps [{}]", to_string(s[i].x), layout_name(s[i].l),
                                         fmt::join(s[i].reps, ",")));
                      return true;
                    }});

const bool kBroadcastTo =
    register_cases({OpId::BroadcastTo, 5, [](Case& c, DType t, int i) {
                      struct S {
                        Shape x, to;
                        Layout l;
                      };
                      const S s[] = {{{257}, {3, 257}, kDense},
                                     {{33, 1}, {33, 129}, kDense},
                                     {{1, 31}, {4, 5, 31}, kDense},
                                     {{17, 1}, {2, 17, 33}, kT},
                                     {{}, {0, 4}, kDense}};
                      c.outs = {broadcast_to(c.rand(s[i].x, t, s[i].l), s[i].to)};
                      c.note(fmt::format("{}{} to {}", to_string(s[i].x), layout_name(s[i].l),
                                         to_string(s[i].to)));
                      return true;
                    }});

const bool kFlip =
    register_cases({OpId::Flip, 5, [](Case& c, DType t, int i) {
                      struct S {
                        Shape x;
                        std::vector<int64_t> axes;
                        Layout l;
                      };
                      const S s[] = {{{257}, {0}, kDense},
                                     {{33, 65}, {}, kDense},
                                     {{4, 31, 5}, {1}, kT},
                                     {{3, 128}, {-1}, kS},
                                     {{0, 3}, {1}, kDense}};
                      c.outs = {flip(c.rand(s[i].x, t, s[i].l), s[i].axes)};
                      c.note(fmt::format("x {}{} axes [{}]", to_string(s[i].x), layout_name(s[i].l),
                                         fmt::join(s[i].axes, ",")));
                      return true;
                    }});

// ---- indexing ----

const bool kGather =
    register_cases({OpId::Gather, 9, [](Case& c, DType t, int i) {
                      struct S {
                        Shape x, idx;
                        int64_t axis;
                        Layout l;
                      };
                      const S s[] = {{{257, 3}, {31}, 0, kDense}, {{4, 129}, {5, 2}, 1, kDense},
                                     {{33, 17}, {128}, -1, kT},   {{3, 5, 7}, {2, 3}, 1, kS},
                                     {{10, 4}, {0}, 0, kDense},   {{6, 3}, {}, 0, kDense}};
                      // cases 6 to 8: the first three with u16, u32 and u64 indices (f32 data)
                      const bool wide = i >= 6;
                      if (wide && t != f32) return false;
                      const S& k = s[wide ? i - 6 : i];
                      const int64_t n = k.x[k.axis < 0 ? k.axis + k.x.size() : k.axis];
                      // negative indices count from the end
                      const DType it = wide ? std::array{u16, u32, u64}[i - 6] : i % 2 ? i32 : i64;
                      Tensor idx = c.ints(k.idx, wide ? 0 : -n, n - 1, it);
                      c.outs = {gather(c.rand(k.x, t, k.l), idx, k.axis)};
                      c.note(fmt::format("x {}{} indices {} {} axis {}", to_string(k.x),
                                         layout_name(k.l), to_string(k.idx), name(it), k.axis));
                      return true;
                    }});

const bool kGatherElements =
    register_cases({OpId::GatherElements, 5, [](Case& c, DType t, int i) {
                      struct S {
                        Shape x, idx;
                        int64_t axis;
                        Layout l;
                      };
                      const S s[] = {{{257}, {300}, 0, kDense},
                                     {{4, 129}, {4, 31}, 1, kDense},
                                     {{33, 17}, {5, 17}, 0, kT},
                                     {{3, 5, 7}, {3, 9, 2}, 1, kS},
                                     {{4, 3}, {0, 3}, 0, kDense}};
                      const int64_t n = s[i].x[s[i].axis];
                      Tensor idx = c.ints(s[i].idx, -n, n - 1, i % 2 ? i32 : i64);
                      c.outs = {gather_elements(c.rand(s[i].x, t, s[i].l), idx, s[i].axis)};
                      c.note(fmt::format("x {}{} indices {} axis {}", to_string(s[i].x),
                                         layout_name(s[i].l), to_string(s[i].idx), s[i].axis));
                      return true;
                    }});

const bool kScatterElements = register_cases(
    {OpId::ScatterElements, 10, [](Case& c, DType t, int i) {
       const ScatterReduction red[] = {ScatterReduction::none, ScatterReduction::add,
                                       ScatterReduction::mul, ScatterReduction::max,
                                       ScatterReduction::min};
       const ScatterReduction r = red[(i + i / 5) % 5];  // each shape with two reductions
       struct S {
         Shape x, idx;
         int64_t axis;
         Layout l;
       };
       const S s[] = {{{257}, {31}, 0, kDense},
                      {{4, 129}, {4, 33}, 1, kDense},
                      {{33, 17}, {5, 17}, 0, kT},
                      {{3, 5, 7}, {3, 4, 2}, 1, kDense},
                      {{6, 4}, {0, 4}, 0, kDense}};
       const S& k = s[i % 5];
       const int64_t n = k.x[k.axis];
       // none: distinct indices along the axis (duplicates would make the winner order-dependent on
       // parallel backends); reductions: repeats welcome
       Tensor idx;
       if (r == ScatterReduction::none) {
         idx = c.input(k.idx, i64, [n, &k](const Shape& sh) {
           std::vector<double> v(static_cast<size_t>(numel(sh)));
           const test::AxisView av = test::split_axis(sh, static_cast<int>(k.axis));
           std::vector<int64_t> perm(static_cast<size_t>(n));
           for (int64_t o = 0; o < av.outer; ++o)
             for (int64_t in = 0; in < av.inner; ++in) {
               std::iota(perm.begin(), perm.end(), 0);
               std::shuffle(perm.begin(), perm.end(), test::rng());
               for (int64_t j = 0; j < av.len; ++j)
                 v[(o * av.len + j) * av.inner + in] = static_cast<double>(perm[j]);
             }
           return from_f64(v, sh, i64);
         });
       } else {
         idx = c.ints(k.idx, -n, n - 1, i % 2 ? i32 : i64);
       }
       Tensor x = c.rand(k.x, t, k.l);
       Tensor upd = r == ScatterReduction::mul && is_floating(t) ? c.rand(k.idx, t, 0.5, 1.5)
                                                                 : c.rand(k.idx, t);
       c.outs = {scatter_elements(x, idx, upd, k.axis, r)};
       c.tol_scale = 2;
       c.note(fmt::format("x {}{} indices {} axis {} reduction {}", to_string(k.x),
                          layout_name(k.l), to_string(k.idx), k.axis, static_cast<int>(r)));
       return true;
     }});

const bool kOneHot = register_cases(
    {OpId::OneHot, 4, [](Case& c, DType t, int i) {
       struct S {
         Shape idx;
         int64_t depth, axis;
       };
       const S s[] = {{{257}, 10, -1}, {{4, 31}, 33, 1}, {{3, 5}, 129, 0}, {{0}, 4, -1}};
       // out-of-range indices give rows of off_value
       Tensor idx = c.ints(s[i].idx, -2, s[i].depth + 1, i % 2 ? i32 : i64);
       c.outs = {one_hot(idx, s[i].depth, s[i].axis, t, t == boolean ? 1 : 3, 0)};
       c.note(
           fmt::format("indices {} depth {} axis {}", to_string(s[i].idx), s[i].depth, s[i].axis));
       return true;
     }});

const bool kCoordinate =
    register_cases({OpId::CoordinateAlongAxis, 4, [](Case& c, DType t, int i) {
                      const Shape shapes[] = {{257}, {33, 65}, {4, 31, 6}, {0, 3}};
                      const int64_t axes[] = {0, 1, -2, 1};
                      c.outs = {coordinate_along_axis(c.rand(shapes[i], f32), axes[i], t)};
                      c.note(fmt::format("x {} axis {}", to_string(shapes[i]), axes[i]));
                      return true;
                    }});

const bool kHamming = register_cases(
    {OpId::HammingDistance, 11, [](Case& c, DType t, int i) {
       struct S {
         Shape a, b;
       };
       const S s[] = {{{31, 4}, {31, 4}}, {{5, 1, 8}, {7, 8}}, {{129, 2}, {2}}, {{0, 3}, {3}}};
       const double lo = !is_signed(t) ? 0
                         : t == i8     ? -128
                         : t == i16    ? -32768
                                       : -1e9,
                    hi = t == u8    ? 255
                         : t == i8  ? 127
                         : t == u16 ? 65535
                         : t == i16 ? 32767
                                    : 1e9;
       if (i >= 4) {  // narrow and f64 results; rows of 1 to 16 bytes, read in units of their size
         const DType result = std::array{i8, u8, i16, f64, u16, u32, u64}[i - 4];
         const int64_t esize = static_cast<int64_t>(size_of(t));
         for (int64_t bytes = esize; bytes <= 16; bytes *= 2)
           c.outs.push_back(hamming_distance(c.rand({3, bytes / esize}, t, lo, hi),
                                             c.rand({bytes / esize}, t, lo, hi), result));
         c.note(fmt::format("(3, n) (n) to {}, rows of {} to 16 bytes", name(result), esize));
         return true;
       }
       c.outs = {hamming_distance(c.rand(s[i].a, t, lo, hi), c.rand(s[i].b, t, lo, hi))};
       c.note(fmt::format("{} {}", to_string(s[i].a), to_string(s[i].b)));
       return true;
     }});

// ---- sorting ----

struct SortCase {
  Shape x;
  int64_t axis;
  Layout l;
};
const SortCase kSorts[] = {{{257}, 0, kDense},     {{3, 31}, -1, kDense}, {{4, 128}, 1, kDense},
                           {{2, 255}, -1, kDense}, {{33, 17}, 0, kT},     {{0, 5}, 1, kDense},
                           {{2, 4097}, 1, kDense}};

void sort_like(OpId op) {
  register_cases(
      {op, 9, [op](Case& c, DType t, int i) {
         const bool nans = i >= 7;  // NaN sorts above every number (stable among NaNs)
         if (nans && !is_floating(t)) return false;
         if (i == 6 && t == bf16) return false;  // 4097 distinct values: f16 holds them, bf16 not
         const SortCase& k = kSorts[nans ? i - 6 : i];
         const bool desc = i % 2;
         Tensor x;
         if (nans) {
           x = c.input(k.x, t, with_nans(t, uniform(t, -1, 1)), k.l);
           c.grad = false;
           c.note("NaNs");
         } else {
           x = c.distinct(k.x, t, k.l);
         }
         if (op == OpId::Sort)
           c.outs = {sort(x, k.axis, desc)};
         else if (op == OpId::Argsort)
           c.outs = {argsort(x, k.axis, desc)};
         else {
           const int64_t len = k.x[k.axis < 0 ? k.axis + k.x.size() : k.axis];
           const int64_t kk = std::min<int64_t>(len, i % 3 == 0 ? 1 : i % 3 == 1 ? 5 : len);
           auto [v, idx] = topk(x, kk, k.axis, !desc);
           c.outs = {v, idx};
           c.note("k " + std::to_string(kk));
         }
         c.note(fmt::format("x {}{} axis {}{}", to_string(k.x), layout_name(k.l), k.axis,
                            desc ? " descending/smallest" : ""));
         return true;
       }});
}

const bool kSorting = [] {
  sort_like(OpId::Sort);
  sort_like(OpId::Argsort);
  sort_like(OpId::Topk);
  return true;
}();

}  // namespace
}  // namespace kiln::harness
