// Symbolic dims (core/sym_dim.h): expressions interned so that equal expressions, written in any
// order or grouping, are one code; folding of sizes; evaluation against sizes drawn at random.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "core/sym_dim.h"

namespace kiln {
namespace {

TEST(SymDim, EqualExpressionsAreOneCode) {
  const int64_t a = sym::symbol("a"), b = sym::symbol("b"), c = sym::symbol("c");
  EXPECT_TRUE(sym::is_symbolic(a));
  EXPECT_EQ(a, sym::symbol("a"));
  EXPECT_NE(a, b);
  EXPECT_EQ(sym::mul(a, b), sym::mul(b, a));
  EXPECT_EQ(sym::mul(sym::mul(a, b), c), sym::mul(a, sym::mul(c, b)));
  EXPECT_EQ(sym::mul(sym::mul(a, 3), 4), sym::mul(12, a));
  EXPECT_EQ(sym::add(sym::add(a, 2), 3), sym::add(5, a));
  EXPECT_EQ(sym::sub(sym::add(a, 5), 2), sym::add(a, 3));
  EXPECT_EQ(sym::mul(a, 1), a);
  EXPECT_EQ(sym::mul(a, 0), 0);
  EXPECT_EQ(sym::add(a, 0), a);
  EXPECT_EQ(sym::sub(a, a), 0);
  EXPECT_EQ(sym::sub(sym::sub(a, 1), sym::sub(a, 130)), 129);  // (a reversed slice's length)
  EXPECT_EQ(sym::sub(sym::add(a, 2), sym::sub(a, 3)), 5);
  EXPECT_EQ(sym::max(a, b), sym::max(b, a));
  EXPECT_EQ(sym::min(a, a), a);
  // a reshape's inferred dim: the elements over the other dims
  EXPECT_EQ(sym::floordiv(sym::mul(sym::mul(a, b), 768), 768), sym::mul(a, b));
  EXPECT_EQ(sym::floordiv(sym::mul(sym::mul(a, b), 768), sym::mul(a, 64)), sym::mul(b, 12));
  EXPECT_EQ(sym::product({a, 12, b, 64}), sym::mul(sym::mul(a, b), 768));
  EXPECT_EQ(sym::str(sym::mul(sym::mul(a, b), 768)), "a*b*768");
  EXPECT_EQ(sym::str(Shape{a, 3}), "(a, 3)");
  EXPECT_EQ(sym::erase({a, 3, -1}), (Shape{-1, 3, -1}));
}

TEST(SymDim, SizesFoldAndUnknownStaysUnknown) {
  EXPECT_EQ(sym::add(3, 4), 7);
  EXPECT_EQ(sym::mul(3, 4), 12);
  EXPECT_EQ(sym::floordiv(7, 2), 3);
  EXPECT_EQ(sym::ceildiv(7, 2), 4);
  EXPECT_EQ(sym::sub(2, 3), kDynamic);  // (not a size)
  const int64_t a = sym::symbol("a");
  EXPECT_EQ(sym::add(a, kDynamic), kDynamic);
  EXPECT_EQ(sym::mul(kDynamic, 2), kDynamic);
  EXPECT_EQ(sym::floordiv(a, 0), kDynamic);
  // arithmetic done on a code without the helpers never reads as another expression
  for (int64_t garbage : {a * 2, a / 2, a + 1, a - 1, a * 3 + 7, int64_t{-2}, INT64_MIN})
    EXPECT_FALSE(sym::is_symbolic(garbage)) << garbage;
  EXPECT_EQ(sym::str(-5), "?");
}

TEST(SymDim, ExpressionsEvaluateToTheirSizes) {
  std::mt19937_64 rng(std::random_device{}());
  const int64_t h = sym::symbol("h"), w = sym::symbol("w"), n = sym::symbol("n");
  // a 3x3 convolution with stride 2 and padding 1, then a 2x2 pool; a concat; a flatten
  const int64_t conv = sym::add(sym::floordiv(sym::sub(sym::add(h, 2), 3), 2), 1);
  const int64_t pooled = sym::ceildiv(conv, 2);
  const int64_t cat = sym::add(sym::mul(n, w), sym::min(h, w));
  const int64_t flat = sym::mul(sym::mul(n, pooled), sym::max(w, 1));
  for (int k = 0; k < 50; ++k) {
    std::map<std::string, int64_t> v{{"h", 3 + static_cast<int64_t>(rng() % 500)},
                                     {"w", static_cast<int64_t>(rng() % 500)},
                                     {"n", 1 + static_cast<int64_t>(rng() % 64)}};
    auto value = [&](const std::string& s) { return v.at(s); };
    const int64_t hv = v["h"], wv = v["w"], nv = v["n"];
    const int64_t cv = (hv + 2 - 3) / 2 + 1;
    EXPECT_EQ(sym::evaluate(conv, value), cv);
    EXPECT_EQ(sym::evaluate(pooled, value), (cv + 1) / 2);
    EXPECT_EQ(sym::evaluate(cat, value), nv * wv + std::min(hv, wv));
    EXPECT_EQ(sym::evaluate(flat, value), nv * ((cv + 1) / 2) * std::max<int64_t>(wv, 1));
  }
  EXPECT_EQ(sym::evaluate(sym::symbol("unbound"), [](const std::string&) { return kDynamic; }),
            kDynamic);
}

}  // namespace
}  // namespace kiln
