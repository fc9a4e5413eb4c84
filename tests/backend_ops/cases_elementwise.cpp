// Cases of the core and elementwise ops.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend_ops/harness.h"
#include "kiln/narrow.h"

namespace kiln::harness {
namespace {

constexpr Layout kDense = Layout::dense, kT = Layout::transposed, kS = Layout::strided;

// ---- core ----

double fill_value(DType t) { return t == boolean ? 1 : is_floating(t) ? 1.75 : 7; }

const bool kFull = register_cases({OpId::Full, 4, [](Case& c, DType t, int i) {
                                     const Shape shapes[] = {{257}, {33, 31}, {0, 4}, {}};
                                     c.outs = {full(c.g, shapes[i], fill_value(t), t)};
                                     c.note("shape " + to_string(shapes[i]));
                                     return true;
                                   }});

const bool kArange = register_cases(
    {OpId::Arange, 4, [](Case& c, DType t, int i) {
       struct R {
         double start, stop, step;
         bool float_only;
       };
       const R r[] = {
           {0, 257, 1, false}, {-3, 29, 0.25, true}, {5, -60, -3, false}, {10, 10, 1, false}};
       if (r[i].float_only && !is_floating(t)) return false;
       if (!is_signed(t) && r[i].stop < 0) return false;
       if ((t == i8) && r[i].stop > 127) return false;
       c.outs = {arange(c.g, r[i].start, r[i].stop, r[i].step, t)};
       c.note(fmt::format("arange({}, {}, {})", r[i].start, r[i].stop, r[i].step));
       return true;
     }});

const bool kAssign = register_cases(
    {OpId::Assign, 3, [](Case& c, DType t, int i) {
       Tensor v = c.g.variable(test::random_array({33, 65}, t, 0, 5), "v");
       Tensor value = i == 0   ? c.rand({65}, t)
                      : i == 1 ? c.rand({33, 65}, t, kT)
                               : c.ints({33, 1}, 0, 1, f32);
       c.outs = {assign(v, value)};
       c.note(i == 0 ? "broadcast row" : i == 1 ? "transposed value" : "cast and broadcast");
       return true;
     }});

// A fed int64 start per dim, each in [0, var - update] (drawn once per case: the CPU and the
// target see the same starts, and writing the same update twice gives the same variable).
Tensor valid_starts(Case& c, const Shape& var, const Shape& up) {
  const auto rank = static_cast<int64_t>(var.size());
  return c.input({rank}, i64, [var, up, rank](const Shape&) {
    std::vector<int64_t> s;
    for (int64_t d = 0; d < rank; ++d)
      s.push_back(
          static_cast<int64_t>(test::to_f64(test::random_ints({1}, 0, var[d] - up[d], i64))[0]));
    return Array::from_vector<int64_t>(s, {rank});
  });
}

const bool kAssignSlice = register_cases(
    {OpId::AssignSlice, 5, [](Case& c, DType t, int i) {
       struct S {
         Shape var, up;
         Layout l;
         bool fed;
         const char* what;
       };
       const S s[] = {{{33, 65}, {5, 7}, kDense, true, "block"},
                      {{4, 16, 8}, {1, 16, 8}, kDense, false, "one cache row at (2, 0, 0)"},
                      {{6, 9, 33}, {2, 9, 31}, kT, true, "transposed update"},
                      {{257}, {31}, kDense, true, "1-d"},
                      {{33, 65}, {0, 65}, kDense, true, "empty update"}};
       const S& k = s[i];
       Tensor v = c.variable(k.var, t);
       Tensor up = c.rand(k.up, t, -3, 3, k.l);
       c.outs = {k.fed ? assign_slice(v, up, valid_starts(c, k.var, k.up))
                       : assign_slice(v, up, std::vector<int64_t>{2, 0, 0})};
       c.note(fmt::format("{} {} into {}", k.what, to_string(k.up), to_string(k.var)));
       return true;
     }});

// ---- binary ----

struct BinShape {
  Shape a, b;
  Layout la, lb;
  const char* what;
};
const BinShape kBinShapes[] = {
    {{31}, {31}, kDense, kDense, "31"},
    {{4, 128}, {4, 128}, kDense, kDense, "4x128"},
    {{3, 257}, {257}, kDense, kDense, "row broadcast"},
    {{33, 1}, {1, 129}, kDense, kDense, "outer broadcast"},
    {{}, {255}, kDense, kDense, "scalar and 255"},
    {{33, 65}, {33, 65}, kT, kS, "transposed and strided"},
    {{0, 7}, {7}, kDense, kDense, "empty"},
    {{2, 1, 3, 33}, {5, 1, 33}, kDense, kDense, "rank broadcast"},
    {{5, 4099}, {4099}, kDense, kDense, "multi-block row broadcast"},
    {{48, 96}, {48, 96}, kDense, kDense, "4608, vector loads"},
};
constexpr int kNumBin = static_cast<int>(std::size(kBinShapes));

using BinaryFn = Tensor (*)(const Tensor&, const Tensor&);
// Generators of the two operands for a dtype.
using GenFor = Gen (*)(DType t, bool second);

Gen default_gen(DType t, bool) {
  if (is_floating(t)) return uniform(t, -1, 1);
  int64_t lo, hi;
  int_range(t, lo, hi);
  return uniform(t, static_cast<double>(lo), static_cast<double>(hi));
}
Gen nonzero_gen(DType t) {
  if (!is_signed(t)) return uniform(t, 1, 9);
  return [t](const Shape& s) { return test::random_nonzero(s, t, is_floating(t) ? 0.25 : 1, 9); };
}
Gen div_gen(DType t, bool second) { return second ? nonzero_gen(t) : default_gen(t, false); }
Gen pow_gen(DType t, bool second) {
  if (is_floating(t)) return second ? uniform(t, -2, 2) : uniform(t, 0.5, 2);
  if (second) return uniform(t, is_signed(t) ? -2 : 0, 3);
  return uniform(t, is_signed(t) ? -3 : 0, 3);
}
// Divisors +-0.5, 1, 2 and dividends k + f away from multiples of them.
Gen mod_gen(DType t, bool second) {
  if (!is_floating(t)) return div_gen(t, second);
  if (!second) return off_ties(t, -4, 4);
  return [t](const Shape& s) {
    const double d[] = {0.5, 1, 2, -0.5, -1, -2};
    std::uniform_int_distribution<int> pick(0, 5);
    std::vector<double> v(static_cast<size_t>(numel(s)));
    for (auto& x : v) x = d[pick(test::rng())];
    return from_f64(v, s, t);
  };
}
// Small integers, so that equal elements are common.
Gen compare_gen(DType t, bool) {
  if (t == boolean) return uniform(t, 0, 1);
  return [t](const Shape& s) {
    return test::random_ints(s, is_signed(t) ? -3 : 0, is_signed(t) ? 3 : 5, f64).astype(t);
  };
}

// Integers over the dtype's range (64-bit: up to 2^53 in magnitude, exact in the doubles the
// generator draws).
Gen bits_gen(DType t, bool) {
  const int bits = std::min(8 * static_cast<int>(size_of(t)), 54);
  const double lo = is_signed(t) ? -std::ldexp(1.0, bits - 1) : 0;
  const double hi = is_signed(t) ? std::ldexp(1.0, bits - 1) - 1 : std::ldexp(1.0, bits) - 1;
  return uniform(t, lo, hi);
}
// Shift amounts in [-2, bits + 2] (negative ones only for signed dtypes): in and out of range.
Gen shift_gen(DType t, bool second) {
  if (!second) return bits_gen(t, false);
  return uniform(t, is_signed(t) ? -2 : 0, static_cast<double>(size_of(t) * 8 + 2));
}

bool binary_case(Case& c, DType t, int i, BinaryFn f, GenFor gen) {
  if (i == kNumBin) {  // NaN propagation
    if (!is_floating(t)) return false;
    Tensor a = c.input({4, 33}, t, with_nans(t, gen(t, false)));
    Tensor b = c.input({33}, t, with_nans(t, gen(t, true)));
    c.outs = {f(a, b)};
    c.grad = false;
    c.note("NaNs in both operands (4, 33) (33)");
    return true;
  }
  const BinShape& s = kBinShapes[i];
  Tensor a = c.input(s.a, t, gen(t, false), s.la);
  Tensor b = c.input(s.b, t, gen(t, true), s.lb);
  c.outs = {f(a, b)};
  c.note(fmt::format("{} {} {}", s.what, to_string(s.a), to_string(s.b)));
  return true;
}

// nan_case: one more case with NaNs (ops whose NaN handling GPUs tend to get wrong)
void binary(OpId op, BinaryFn f, GenFor gen, bool nan_case = false) {
  register_cases({op, kNumBin + nan_case,
                  [f, gen](Case& c, DType t, int i) { return binary_case(c, t, i, f, gen); }});
}

const bool kBinary = [] {
  binary(OpId::Add, add, default_gen);
  binary(OpId::Sub, sub, default_gen);
  binary(OpId::Mul, mul, default_gen);
  binary(OpId::Div, div, div_gen);
  binary(OpId::Pow, pow, pow_gen);
  binary(OpId::Maximum, maximum, default_gen, true);
  binary(OpId::Minimum, minimum, default_gen, true);
  binary(OpId::Mod, mod, mod_gen);
  binary(OpId::Equal, equal, compare_gen);
  binary(OpId::NotEqual, not_equal, compare_gen);
  binary(OpId::Less, less, compare_gen);
  binary(OpId::LessEqual, less_equal, compare_gen);
  binary(OpId::Greater, greater, compare_gen);
  binary(OpId::GreaterEqual, greater_equal, compare_gen);
  binary(OpId::LogicalAnd, logical_and, compare_gen);
  binary(OpId::LogicalOr, logical_or, compare_gen);
  binary(OpId::LogicalXor, logical_xor, compare_gen);
  binary(OpId::BitwiseAnd, bitwise_and, bits_gen);
  binary(OpId::BitwiseOr, bitwise_or, bits_gen);
  binary(OpId::BitwiseXor, bitwise_xor, bits_gen);
  return true;
}();

// bit_shift: cases 0..kNumBin-1 shift left, the rest right.
Tensor shift_left(const Tensor& a, const Tensor& b) { return bit_shift(a, b, true); }
Tensor shift_right(const Tensor& a, const Tensor& b) { return bit_shift(a, b, false); }
const bool kBitShift = register_cases({OpId::BitShift, 2 * kNumBin, [](Case& c, DType t, int i) {
                                         const bool left = i < kNumBin;
                                         c.note(left ? "left" : "right");
                                         return binary_case(c, t, i % kNumBin,
                                                            left ? shift_left : shift_right,
                                                            shift_gen);
                                       }});

// ---- unary ----

struct UnShape {
  Shape s;
  Layout l;
};
// (64 x 130: past the element count where CUDA's kernels load vectors)
const UnShape kUnShapes[] = {{{31}, kDense}, {{128}, kDense},    {{3, 257}, kDense},
                             {{33, 65}, kT}, {{17, 129}, kS},    {{0}, kDense},
                             {{}, kDense},   {{64, 130}, kDense}};
constexpr int kNumUn = static_cast<int>(std::size(kUnShapes));

// Float inputs of an op: uniform in [lo, hi), or `gen` when set.
struct UnaryDef {
  OpId op;
  std::function<Tensor(const Tensor&, int)> f;  // (x, case index): attrs vary with the index
  double lo = -4, hi = 4;
  Gen (*gen)(DType) = nullptr;
  const char* attrs[2] = {"", ""};  // label of the attrs at even and odd indices
};

void unary(const UnaryDef& d) {
  register_cases({d.op, kNumUn + 1, [d](Case& c, DType t, int i) {
                    const bool nans = i == kNumUn;  // the last case: NaN propagation
                    if (nans && !is_floating(t)) return false;
                    const UnShape& s = nans ? kUnShapes[2] : kUnShapes[i];
                    Gen g;
                    if (d.gen)
                      g = d.gen(t);
                    else if (is_floating(t))
                      g = uniform(t, d.lo, d.hi);
                    else
                      g = default_gen(t, false);
                    if (nans) g = with_nans(t, g), c.grad = false, c.note("NaNs");
                    Tensor x = c.input(s.s, t, g, s.l);
                    c.outs = {d.f(x, i)};
                    c.note(fmt::format("{}{} {}", to_string(s.s),
                                       s.l == kT   ? " transposed"
                                       : s.l == kS ? " strided"
                                                   : "",
                                       d.attrs[i % 2]));
                    return true;
                  }});
}

Gen sign_gen(DType t) { return is_floating(t) ? nonzero_gen(t) : default_gen(t, false); }
Gen round_gen(DType t) { return is_floating(t) ? off_ties(t, -5, 5) : default_gen(t, false); }
Gen recip_gen(DType t) { return nonzero_gen(t); }

template <Tensor (*F)(const Tensor&)>
Tensor plain(const Tensor& x, int) {
  return F(x);
}

const bool kUnary = [] {
  unary({OpId::Neg, plain<neg>});
  unary({OpId::Abs, plain<abs>});
  unary({OpId::Sign, plain<sign>, -4, 4, sign_gen});
  unary({OpId::Exp, plain<exp>, -5, 5});
  unary({OpId::Log, plain<log>, 0.1, 4});
  unary({OpId::Log1p, plain<log1p>, -0.5, 3});
  unary({OpId::Expm1, plain<expm1>, -3, 3});
  unary({OpId::Sqrt, plain<sqrt>, 0.1, 4});
  unary({OpId::Rsqrt, plain<rsqrt>, 0.1, 4});
  unary({OpId::Reciprocal, plain<reciprocal>, -4, 4, recip_gen});
  unary({OpId::Sin, plain<sin>});
  unary({OpId::Cos, plain<cos>});
  unary({OpId::Tanh, plain<tanh>});
  unary({OpId::Sigmoid, plain<sigmoid>, -6, 6});
  unary({OpId::Relu, plain<relu>});
  unary({OpId::LeakyRelu,
         [](const Tensor& x, int i) { return leaky_relu(x, i % 2 ? 0.2 : 0.01); },
         -4,
         4,
         nullptr,
         {"alpha 0.01", "alpha 0.2"}});
  unary({OpId::Elu,
         [](const Tensor& x, int i) { return elu(x, i % 2 ? 0.5 : 1.0); },
         -4,
         4,
         nullptr,
         {"alpha 1", "alpha 0.5"}});
  unary({OpId::Selu, plain<selu>});
  unary(
      {OpId::Gelu,
       [](const Tensor& x, int i) { return gelu(x, i % 2 ? GeluApprox::tanh : GeluApprox::none); },
       -4,
       4,
       nullptr,
       {"exact", "tanh approximation"}});
  unary({OpId::Silu, plain<silu>});
  unary({OpId::Mish, plain<mish>, -6, 24});
  unary({OpId::Softplus,
         [](const Tensor& x, int i) { return i % 2 ? softplus(x, 2.0, 3.0) : softplus(x); },
         -4,
         4,
         nullptr,
         {"beta 1 threshold 20", "beta 2 threshold 3"}});
  unary({OpId::Softshrink,
         [](const Tensor& x, int i) { return softshrink(x, i % 2 ? 1.5 : 0.5); },
         -4,
         4,
         nullptr,
         {"lambda 0.5", "lambda 1.5"}});
  unary({OpId::Hardshrink,
         [](const Tensor& x, int i) { return hardshrink(x, i % 2 ? 1.5 : 0.5); },
         -4,
         4,
         nullptr,
         {"lambda 0.5", "lambda 1.5"}});
  unary({OpId::Hardswish, plain<hardswish>});
  unary({OpId::Hardsigmoid,
         [](const Tensor& x, int i) { return i % 2 ? hardsigmoid(x, 0.25, 0.3) : hardsigmoid(x); },
         -4,
         4,
         nullptr,
         {"alpha 1/6 beta 0.5", "alpha 0.25 beta 0.3"}});
  unary({OpId::Erf, plain<erf>, -3, 3});
  unary({OpId::Floor, plain<floor>, -5, 5, round_gen});
  unary({OpId::Ceil, plain<ceil>, -5, 5, round_gen});
  unary({OpId::Round, plain<round>, -5, 5, round_gen});
  unary(
      {OpId::Clip,
       [](const Tensor& x, int i) {
         const double inf = std::numeric_limits<double>::infinity();
         if (!is_floating(x.dtype())) return i % 2 ? clip(x, 0, 10) : clip(x, -5, 5);
         return i % 3 == 0 ? clip(x, -1, 1) : i % 3 == 1 ? clip(x, -inf, 0.5) : clip(x, -0.5, inf);
       },
       -2,
       2,
       nullptr,
       {"bounds by case", "bounds by case"}});
  unary({OpId::Tan, plain<tan>, -1.2, 1.2});
  unary({OpId::Asin, plain<asin>, -0.95, 0.95});
  unary({OpId::Acos, plain<acos>, -0.95, 0.95});
  unary({OpId::Atan, plain<atan>, -6, 6});
  unary({OpId::Sinh, plain<sinh>, -4, 4});
  unary({OpId::Cosh, plain<cosh>, -4, 4});
  unary({OpId::Asinh, plain<asinh>, -8, 8});
  unary({OpId::Acosh, plain<acosh>, 1.05, 8});
  unary({OpId::Atanh, plain<atanh>, -0.95, 0.95});
  unary({OpId::LogicalNot, plain<logical_not>});
  unary({OpId::BitwiseNot, plain<bitwise_not>});
  return true;
}();

// ---- select, cast, classification ----

const bool kWhere = register_cases({OpId::Where, 6, [](Case& c, DType t, int i) {
                                      struct S {
                                        Shape cond, x, y;
                                        Layout lx, ly;
                                      };
                                      const Shape v{64, 130};  // vector loads on CUDA
                                      const S s[] = {{{257}, {257}, {257}, kDense, kDense},
                                                     {{33, 1}, {1, 129}, {33, 129}, kDense, kDense},
                                                     {{}, {17, 33}, {17, 33}, kT, kS},
                                                     {{0, 3}, {0, 3}, {3}, kDense, kDense},
                                                     {{4, 31}, {}, {4, 31}, kDense, kDense},
                                                     {v, v, v, kDense, kDense}};
                                      Tensor cond = c.rand(s[i].cond, boolean);
                                      Tensor x = c.rand(s[i].x, t, s[i].lx);
                                      Tensor y = c.rand(s[i].y, t, s[i].ly);
                                      c.outs = {where(cond, x, y)};
                                      c.note(fmt::format("cond {} x {} y {}", to_string(s[i].cond),
                                                         to_string(s[i].x), to_string(s[i].y)));
                                      return true;
                                    }});

constexpr DType kNarrowKinds[] = {f8e4m3fn, f8e4m3fnuz, f8e5m2, f8e5m2fnuz, f8e8m0fnu,
                                  f4e2m1fn, i4,         u4,     i2,         u2};

// The largest magnitude worth drawing for a narrow type (e8m0's range is f32's: its rounding is
// what matters, so a moderate one).
double narrow_top(DType t) {
  switch (t) {
    case DType::f8e8m0fnu:
      return 1048576;
    case DType::f4e2m1fn:
      return 6;
    case DType::i4:
      return 8;
    case DType::u4:
      return 15;
    case DType::i2:
      return 2;
    case DType::u2:
      return 3;
    default:
      return f8::format(t).max;
  }
}

// A rounding tie near x: the midpoint between x's code and the next one away from zero (for the
// integers, x's integer plus one half); x itself where that one is not finite.
double narrow_tie(DType t, double x) {
  const narrow::Codec c = narrow::codec(t);
  if (c.kind == narrow::Codec::integer) return std::floor(x) + 0.5;
  const uint8_t code = narrow::encode(static_cast<float>(x), c);
  const int mag = c.kind == narrow::Codec::e8m0 ? 0xff : c.kind == narrow::Codec::e2m1 ? 7 : 0x7f;
  if ((code & mag) == mag) return x;
  const double a = narrow::decode(code, c), b = narrow::decode(static_cast<uint8_t>(code + 1), c);
  return std::isfinite(b) ? (a + b) / 2 : x;
}

// To and from each narrow type (every harness dtype on either side), six cases each: to it,
// saturating or not (f8e8m0fnu rounding up, to nearest or down in turn), over 257 and 64 x 130
// elements (past the count where CUDA's kernels load vectors), of values past its range, at its
// rounding ties, NaN and infinities (for the float sources); from it, over the same two shapes, of
// random bytes (every code, NaNs and infinities too, and bits above a 4- or 2-bit code); then
// every byte to the next narrow type. Both backends must give the same codes and values.
constexpr int kNarrowCases = 8;
constexpr int kNumNarrowCases = kNarrowCases * static_cast<int>(std::size(kNarrowKinds));
bool cast_narrow_case(Case& c, DType t, int i) {
  const size_t kind = static_cast<size_t>(i / kNarrowCases);
  const DType nt = kNarrowKinds[kind];
  const int sub = i % kNarrowCases;
  const Gen bytes = [nt](const Shape& s) {
    const Array b = test::random_array(s, u8, 0, 255);
    return Array::from_data(b.data(), s, nt);
  };
  if (sub >= 6) {  // every code to the next type, saturating (257) or not (64 x 130), once
    if (t != f32) return false;
    const DType to = kNarrowKinds[(kind + 1) % std::size(kNarrowKinds)];
    const Shape shape = sub == 6 ? Shape{257} : Shape{64, 130};
    c.outs = {cast(c.input(shape, nt, bytes, kDense), to, sub == 6)};
    c.grad = false;
    c.note(fmt::format("{} to {} {}{}", name(nt), name(to), to_string(shape),
                       sub == 6 ? "" : " not saturating"));
    return true;
  }
  const bool to_narrow = sub < 4, saturate = sub < 2;
  const narrow::Round round = nt != f8e8m0fnu ? narrow::Round::up
                              : sub % 3 == 0  ? narrow::Round::up
                              : sub % 3 == 1  ? narrow::Round::nearest
                                              : narrow::Round::down;
  const Shape shape = sub % 2 == 0 ? Shape{257} : Shape{64, 130};
  const Gen values = [t, nt](const Shape& s) {
    if (t == boolean) return test::random_array(s, boolean, 0, 1);
    const double top = 2 * narrow_top(nt);
    const bool real = is_floating(t);
    // integers over their range, up to ±top
    const double hi =
        real ? top
             : std::min(std::ldexp(1.0, 8 * static_cast<int>(size_of(t)) - is_signed(t)) - 1, top);
    const double lo = !is_signed(t) ? 0 : real ? -top : -std::min(hi + 1, top);
    std::vector<double> d = test::to_f64(test::random_array(s, real ? f64 : t, lo, hi));
    if (real) {  // ties between neighbouring codes, and NaN and infinities
      for (size_t k = 0; k + 1 < d.size(); k += 7) d[k] = narrow_tie(nt, d[k]);
      if (d.size() > 5) d[1] = NAN, d[3] = INFINITY, d[5] = -INFINITY;
    }
    return Array::from_data(d.data(), s, f64).astype(t);
  };
  Tensor x = c.input(shape, to_narrow ? t : nt, to_narrow ? values : bytes, kDense);
  c.outs = {to_narrow ? cast(x, nt, narrow::Rules{saturate, round}) : cast(x, t)};
  c.grad = false;
  c.note(fmt::format("{} {} {}{}{}", to_narrow ? "to" : "from", name(nt), to_string(shape),
                     to_narrow && !saturate ? " not saturating" : "",
                     round == narrow::Round::nearest ? " to nearest"
                     : round == narrow::Round::down  ? " down"
                                                     : ""));
  return true;
}

// to every other harness dtype over three shapes, then cast_narrow_case's
const bool kCast = register_cases(
    {OpId::Cast, 3 * static_cast<int>(std::size(kHarnessTypes)) + kNumNarrowCases,
     [](Case& c, DType t, int i) {
       const int n = static_cast<int>(std::size(kHarnessTypes));
       if (i >= 3 * n) return cast_narrow_case(c, t, i - 3 * n);
       const DType to = kHarnessTypes[i % n];
       if (to == t) return false;  // no node
       // (64 x 130: past the element count where CUDA's kernels load vectors)
       const Shape shape = i < n ? Shape{257} : i < 2 * n ? Shape{33, 65} : Shape{64, 130};
       const Layout l = i < n || i >= 2 * n ? kDense : kT;
       // non-negative values in range of every dtype, away from integer ties
       Tensor x = is_floating(t) ? c.input(shape, t, off_ties(t, 0, 99), l)
                  : t == boolean ? c.rand(shape, t, l)
                                 : c.ints(shape, 0, 100, t, l);
       c.outs = {cast(x, to)};
       c.grad = is_floating(to);
       c.note(fmt::format("to {} {}{}", name(to), to_string(shape), l == kT ? " transposed" : ""));
       return true;
     }});

// bitcast to every harness dtype of the input's element size, over shapes with a scalar, an empty
// and a transposed input. To a float or bool, the input's bits are those of random values of the
// target dtype (finite floats, bytes of 0 and 1), so both backends' outputs compare as values;
// to an integer, the input is random values of its own dtype.
const bool kBitcast = register_cases(
    {OpId::Bitcast, 5 * static_cast<int>(std::size(kHarnessTypes)), [](Case& c, DType t, int i) {
       const int n = static_cast<int>(std::size(kHarnessTypes));
       const DType to = kHarnessTypes[i % n];
       if (size_of(to) != size_of(t)) return false;
       const Shape shapes[] = {{257}, {33, 65}, {}, {0, 3}, {64, 130}};
       const Shape& shape = shapes[i / n];
       const Layout l = i / n == 1 ? kT : kDense;
       const Gen bits = [t, to](const Shape& s) {
         const DType src = is_floating(to) || to == boolean ? to : t;
         // integers over their whole range (i64: 53 bits, as doubles carry them)
         const int bits = std::min<int>(8 * static_cast<int>(size_of(src)) - 1, 52);
         const double half = src == boolean ? 0.5 : std::ldexp(1.0, bits);
         const bool sign = is_signed(src) && src != boolean;
         const double lo = sign ? -half : 0, hi = sign || src == boolean ? half - 1 : 2 * half - 1;
         Array v = is_floating(src) ? test::random_array(s, src, -4, 4)
                                    : test::random_array(s, src, lo, hi);
         return Array::from_data(v.data(), s, t);
       };
       c.outs = {bitcast(c.input(shape, t, bits, l), to)};
       c.grad = false;
       c.note(fmt::format("to {} {}{}", name(to), to_string(shape), l == kT ? " transposed" : ""));
       return true;
     }});

// Random values with NaN, +inf and -inf mixed in (floats).
Gen specials(DType t) {
  return [t](const Shape& s) {
    std::vector<double> v = test::to_f64(test::random_array(s, f64, -3, 3));
    const double inf = std::numeric_limits<double>::infinity();
    for (size_t k = 0; k < v.size(); ++k) {
      if (k % 7 == 3)
        v[k] = NAN;
      else if (k % 11 == 5)
        v[k] = inf;
      else if (k % 13 == 2)
        v[k] = -inf;
    }
    if (!is_floating(t)) return test::random_array(s, t, 0, 9);
    return from_f64(v, s, t);
  };
}

void classify(OpId op, Tensor (*f)(const Tensor&)) {
  register_cases({op, 4, [f](Case& c, DType t, int i) {
                    // (64 x 130: past the element count where CUDA's kernels load vectors)
                    const Shape shapes[] = {{257}, {33, 65}, {0}, {64, 130}};
                    Tensor x = c.input(shapes[i], t, specials(t), i == 1 ? kT : kDense);
                    c.outs = {f(x)};
                    c.note(to_string(shapes[i]));
                    return true;
                  }});
}

const bool kClassify = [] {
  classify(OpId::IsNan, isnan);
  classify(OpId::IsInf, isinf);
  return true;
}();

}  // namespace
}  // namespace kiln::harness
