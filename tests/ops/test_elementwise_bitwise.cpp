// Bitwise ops (bitwise_and/or/xor/not, bit_shift) on every integer dtype: fresh random bit
// patterns over the whole range, numpy broadcasting both ways, references computed bit by bit
// (and/or/xor/not) or in 128-bit arithmetic (shifts), numpy's values at the edges, and errors.
#include <cstdint>
#include <functional>
#include <limits>

#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

using BinaryOp = std::function<Tensor(const Tensor&, const Tensor&)>;

struct BroadcastCase { Shape a, b, out; };
const std::vector<BroadcastCase> kCases = {
    {{3, 4}, {3, 4}, {3, 4}},    {{3, 1}, {1, 4}, {3, 4}}, {{2, 3, 4}, {4}, {2, 3, 4}},
    {{4}, {2, 3, 4}, {2, 3, 4}}, {{}, {5}, {5}},           {{5}, {}, {5}},
    {{}, {}, {}},                {{0, 3}, {3}, {0, 3}},    {{7, 1, 5}, {1, 6, 1}, {7, 6, 5}},
    {{40000}, {40000}, {40000}}};

constexpr DType kIntDtypes[] = {i8, u8, i16, u16, i32, u32, i64, u64};

// Uniform random bit patterns of T.
template <typename T> Array random_bits(const Shape& s) {
  std::vector<T> v(static_cast<size_t>(numel(s)));
  for (T& e : v) e = static_cast<T>(rng()());
  return Array::from_vector<T>(v, s);
}
// Shift amounts in [-2, bits + 2] (negative ones only for signed T): in and out of range.
template <typename T> Array random_amounts(const Shape& s) {
  constexpr int64_t bits = sizeof(T) * 8;
  std::uniform_int_distribution<int64_t> d(std::is_signed_v<T> ? -2 : 0, bits + 2);
  std::vector<T> v(static_cast<size_t>(numel(s)));
  for (T& e : v) e = static_cast<T>(d(rng()));
  return Array::from_vector<T>(v, s);
}

// f applied to each of the 64 bit positions of the (sign-extended) operands.
template <typename T> T per_bit(T a, T b, const std::function<bool(bool, bool)>& f) {
  const auto ua = static_cast<uint64_t>(static_cast<int64_t>(a));
  const auto ub = static_cast<uint64_t>(static_cast<int64_t>(b));
  uint64_t r = 0;
  for (int k = 0; k < 64; ++k)
    if (f((ua >> k) & 1, (ub >> k) & 1)) r |= uint64_t(1) << k;
  return static_cast<T>(r);
}

// numpy left_shift/right_shift, in 128-bit arithmetic: a * 2^b modulo 2^bits, floor(a / 2^b).
template <typename T> T ref_shift(T a, T b, bool left) {
  constexpr int bits = sizeof(T) * 8;
  const bool in_range = static_cast<int64_t>(b) >= 0 && static_cast<int64_t>(b) < bits;
  if (!in_range) {
    if constexpr (std::is_signed_v<T>)
      if (!left && a < 0) return T(-1);
    return T(0);
  }
  const __int128 p = static_cast<__int128>(1) << static_cast<int>(b);
  const __int128 wa = a;
  if (left) return static_cast<T>(static_cast<uint64_t>(static_cast<unsigned __int128>(wa * p)));
  __int128 q = wa / p;
  if (wa % p != 0 && wa < 0) --q;
  return static_cast<T>(q);
}

template <typename T> using Ref = std::function<T(T, T)>;

// op against ref over every broadcast case; the second operand from `second` (bits if null).
template <typename T>
void check_typed(const BinaryOp& op, DType t, const Ref<T>& ref,
                 Array (*second)(const Shape&) = nullptr) {
  for (const auto& c : kCases) {
    SCOPED_TRACE(std::string(name(t)) + " " + to_string(c.a) + " with " + to_string(c.b));
    Graph g;
    auto a = g.placeholder(c.a, t, "a");
    auto b = g.placeholder(c.b, t, "b");
    auto y = op(a, b);
    EXPECT_EQ(y.dtype(), t);
    Array va = random_bits<T>(c.a), vb = second ? second(c.b) : random_bits<T>(c.b);
    Array out = eval1(g, y, {{a, va}, {b, vb}});
    ASSERT_EQ(to_string(out.shape()), to_string(c.out));
    const auto pa = va.to_vector<T>(), pb = vb.to_vector<T>(), got = out.to_vector<T>();
    int bad = 0;
    for (int64_t i = 0; i < numel(c.out) && bad < 5; ++i) {
      const auto idx = unravel(i, c.out);
      const T x = pa[broadcast_offset(idx, c.a, c.out)], z = pb[broadcast_offset(idx, c.b, c.out)];
      const T want = ref(x, z);
      if (got[i] != want) {
        ++bad;
        ADD_FAILURE() << "at " << i << ": op(" << int64_t(x) << ", " << int64_t(z) << ") = "
                      << int64_t(got[i]) << ", expected " << int64_t(want);
      }
    }
  }
}

// Runs check_typed for every integer dtype with the reference made for each element type.
template <typename MakeRef>
void check_all(const BinaryOp& op, MakeRef make_ref, bool shift_amounts = false) {
  for (DType t : kIntDtypes) {
    switch (t) {
#define KILN_CASE(D, T)                                                              \
  case DType::D:                                                                     \
    check_typed<T>(op, t, make_ref(T{}), shift_amounts ? random_amounts<T> : nullptr); \
    break;
      KILN_CASE(i8, int8_t)
      KILN_CASE(u8, uint8_t)
      KILN_CASE(i16, int16_t)
      KILN_CASE(i32, int32_t)
      KILN_CASE(i64, int64_t)
      KILN_CASE(u16, uint16_t)
      KILN_CASE(u32, uint32_t)
      KILN_CASE(u64, uint64_t)
#undef KILN_CASE
      default: FAIL() << "not an integer dtype";
    }
  }
}

// Mixed, float and bool operands are DTypeErrors naming the op, dtypes and shapes.
void check_errors(const BinaryOp& op, const std::string& name) {
  Graph g;
  auto a = g.placeholder({2, 3}, i32, "a");
  auto b = g.placeholder({3}, i64, "b");
  expect_error<DTypeError>([&] { op(a, b); }, {"[" + name + "]", "i32", "i64", "(2, 3)", "(3,)"});
  auto f = g.placeholder({4}, f32, "f");
  expect_error<DTypeError>([&] { op(f, f); }, {"[" + name + "]", "f32", "integer"});
  auto t = g.placeholder({4}, boolean, "t");
  expect_error<DTypeError>([&] { op(t, t); }, {"[" + name + "]", "bool"});
  expect_error<ShapeError>([&] { op(a, g.placeholder({4}, i32, "c")); }, {"(2, 3)", "(4,)"});
}

// Expects op(a, b) == expected in dtype t, for exact integer values.
void expect_values(const BinaryOp& op, DType t, const std::vector<double>& a,
                   const std::vector<double>& b, const std::vector<double>& expected) {
  Graph g;
  const Shape s{static_cast<int64_t>(a.size())};
  auto pa = g.placeholder(s, t, "a");
  auto pb = g.placeholder(s, t, "b");
  expect_equal(eval1(g, op(pa, pb), {{pa, Array::from_vector(a, s).astype(t)},
                                     {pb, Array::from_vector(b, s).astype(t)}}),
               s, expected);
}

TEST(BitwiseAnd, MatchesReference) {
  check_all(bitwise_and, [](auto t) {
    using T = decltype(t);
    return Ref<T>([](T a, T b) { return per_bit<T>(a, b, [](bool x, bool y) { return x && y; }); });
  });
  expect_values(bitwise_and, i8, {-1, -128, 12, 127}, {-86, 127, 10, -128}, {-86, 0, 8, 0});
  check_errors(bitwise_and, "bitwise_and");
}

TEST(BitwiseOr, MatchesReference) {
  check_all(bitwise_or, [](auto t) {
    using T = decltype(t);
    return Ref<T>([](T a, T b) { return per_bit<T>(a, b, [](bool x, bool y) { return x || y; }); });
  });
  expect_values(bitwise_or, u8, {0, 12, 128}, {255, 10, 127}, {255, 14, 255});
  check_errors(bitwise_or, "bitwise_or");
}

TEST(BitwiseXor, MatchesReference) {
  check_all(bitwise_xor, [](auto t) {
    using T = decltype(t);
    return Ref<T>([](T a, T b) { return per_bit<T>(a, b, [](bool x, bool y) { return x != y; }); });
  });
  expect_values(bitwise_xor, i16, {-1, 12, 0}, {0, 10, -32768}, {-1, 6, -32768});
  check_errors(bitwise_xor, "bitwise_xor");
}

TEST(BitwiseNot, MatchesReference) {
  // ~x = -x - 1 in two's complement; 2^bits - 1 - x for the unsigned types (u64 below)
  for (DType t : kIntDtypes) {
    if (t == u64) continue;
    for (Shape s : {Shape{3, 67}, Shape{}, Shape{0, 2}, Shape{40000}}) {
      SCOPED_TRACE(std::string(name(t)) + " " + to_string(s));
      Graph g;
      auto x = g.placeholder(s, t, "x");
      int64_t lo = -1000, hi = 1000;
      if (t == i8) lo = -128, hi = 127;
      if (t == u8) lo = 0, hi = 255;
      if (!is_signed(t)) lo = 0;
      Array v = random_ints(s, lo, hi, t);
      const double top = std::ldexp(1.0, 8 * static_cast<int>(size_of(t))) - 1;
      std::vector<double> ref;
      for (double e : to_f64(v)) ref.push_back(is_signed(t) ? -e - 1 : top - e);
      expect_equal(eval1(g, bitwise_not(x), {{x, v}}), s, ref);
    }
  }
  // the whole range of i64 and u64 (doubles would round): ~x == -x - 1 == x ^ all ones
  Graph g;
  auto x = g.placeholder({100}, i64, "x");
  Array v = random_bits<int64_t>({100});
  const auto got = eval1(g, bitwise_not(x), {{x, v}}).to_vector<int64_t>();
  const auto in = v.to_vector<int64_t>();
  for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(got[i], static_cast<int64_t>(~uint64_t(in[i])));
  auto xu = g.placeholder({100}, u64, "xu");
  Array vu = random_bits<uint64_t>({100});
  const auto gotu = eval1(g, bitwise_not(xu), {{xu, vu}}).to_vector<uint64_t>();
  const auto inu = vu.to_vector<uint64_t>();
  for (size_t i = 0; i < inu.size(); ++i) EXPECT_EQ(gotu[i], ~inu[i]);
  expect_error<DTypeError>([&] { bitwise_not(g.placeholder({2, 2}, f64, "f")); },
                           {"[bitwise_not]", "f64", "integer"});
  expect_error<DTypeError>([&] { bitwise_not(g.placeholder({2}, boolean, "t")); },
                           {"[bitwise_not]", "bool"});
}

BinaryOp shift(bool left) {
  return [left](const Tensor& a, const Tensor& b) { return bit_shift(a, b, left); };
}

TEST(BitShift, LeftMatchesReference) {
  check_all(
      shift(true),
      [](auto t) {
        using T = decltype(t);
        return Ref<T>([](T a, T b) { return ref_shift<T>(a, b, true); });
      },
      true);
  check_errors(shift(true), "bit_shift");
}

TEST(BitShift, RightMatchesReference) {
  check_all(
      shift(false),
      [](auto t) {
        using T = decltype(t);
        return Ref<T>([](T a, T b) { return ref_shift<T>(a, b, false); });
      },
      true);
  check_errors(shift(false), "bit_shift");
}

// The values numpy.left_shift / numpy.right_shift give (documented in elementwise.h).
TEST(BitShift, NumpyEdgeValues) {
  expect_values(shift(true), i8, {1, 5, 5, -1, 3}, {7, 8, -1, 0, 2}, {-128, 0, 0, -1, 12});
  expect_values(shift(true), u8, {255, 1}, {1, 9}, {254, 0});
  expect_values(shift(false), i8, {-128, -5, -5, 5, -5, 100}, {7, 1, 8, 9, -1, 2},
                {-1, -3, -1, 0, -1, 25});
  expect_values(shift(false), u8, {200, 200}, {3, 8}, {25, 0});
  Graph g;
  auto a = g.placeholder({2}, i64, "a");
  auto b = g.placeholder({2}, i64, "b");
  const int64_t lo = std::numeric_limits<int64_t>::min();
  Feeds feeds{{a, Array::from_vector<int64_t>({-3, lo}, {2})},
              {b, Array::from_vector<int64_t>({63, 63}, {2})}};
  EXPECT_EQ(eval1(g, bit_shift(a, b, true), feeds).to_vector<int64_t>(),
            (std::vector<int64_t>{lo, 0}));
  EXPECT_EQ(eval1(g, bit_shift(a, b, false), feeds).to_vector<int64_t>(),
            (std::vector<int64_t>{-1, -1}));
}

}  // namespace
}  // namespace kiln
