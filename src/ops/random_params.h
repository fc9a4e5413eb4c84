// The random family's attributes (src/ops/random.cpp documents them) decoded once into the structs
// its kernels read. (C++17: CUDA files include it.)
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/errors.h"
#include "core/op_id.h"
#include "core/op_params.h"
#include "ops/philox.h"
#include "ops/random_util.h"

namespace kiln {

/// random_philox_state: the six state words (counter words 0-3, key words 0-1) as the output's
/// i32 values.
struct PhiloxStateParams : OpParams {
  int32_t state[6] = {};

  static PhiloxStateParams decode(OpId op, const Attrs& a) {
    PhiloxStateParams p;
    const std::vector<int64_t>& w = a.ints("state");
    if (w.size() != 6)
      fail<ValueError>("[{}] state attribute has {} words; 6 expected", op_name(op), w.size());
    for (int i = 0; i < 6; ++i) p.state[i] = static_cast<int32_t>(static_cast<uint32_t>(w[i]));
    return p;
  }
};

/// random_uniform, random_normal, random_truncated_normal, random_bernoulli,
/// random_dropout_mask, random_integer: the distribution's parameters (only the op's own are
/// set), which params<A>() converts to the generator's.
struct RandomParams : OpParams {
  /// uniform: min, max; normal and truncated_normal: mean, std.
  double a = 0, b = 1;
  /// truncated_normal: the accepted standard-normal range (open), then the result's clamp.
  double lo = 0, hi = 0, min = 0, max = 0;
  /// bernoulli, dropout_mask: a uint32 draw below threshold (p * 2^32, rounded) is a 1; inv_p is
  /// 1 / p (the dropout mask's scale).
  uint64_t threshold = 0;
  double inv_p = 0;
  /// integer: [low, high) as low and high - low (mod 2^64).
  int64_t low = 0;
  uint64_t range = 0;

  /// The parameters of distribution `d` (the op's: random_util::dist_of) in arithmetic type A.
  template <typename A> philox::Params<A> params(philox::Dist d) const {
    philox::Params<A> p;
    switch (d) {
      case philox::Dist::uniform:
      case philox::Dist::normal:
        p.a = static_cast<A>(a);
        p.b = static_cast<A>(b);
        break;
      case philox::Dist::truncated_normal:
        p.a = static_cast<A>(a);
        p.b = static_cast<A>(b);
        p.lo = static_cast<A>(lo);
        p.hi = static_cast<A>(hi);
        p.min = static_cast<A>(min);
        p.max = static_cast<A>(max);
        break;
      case philox::Dist::bernoulli:
      case philox::Dist::dropout_mask:
        p.threshold = threshold;
        p.scale = static_cast<A>(inv_p);
        break;
      case philox::Dist::integer:
        p.low = low;
        p.range = range;
        break;
    }
    return p;
  }

  static RandomParams decode(OpId op, const Attrs& at) {
    RandomParams p;
    switch (random_util::dist_of(op)) {
      case philox::Dist::uniform:
      case philox::Dist::normal:
        p.a = at.f("a");
        p.b = at.f("b");
        break;
      case philox::Dist::truncated_normal:
        p.a = at.f("a");
        p.b = at.f("b");
        p.lo = at.f("lo");
        p.hi = at.f("hi");
        p.min = at.f("min");
        p.max = at.f("max");
        break;
      case philox::Dist::bernoulli:
      case philox::Dist::dropout_mask:
        // x < p * 2^32 for a uint32 x: probability p, exact to 2^-32
        p.threshold = static_cast<uint64_t>(std::llround(std::ldexp(at.f("p"), 32)));
        p.inv_p = 1.0 / at.f("p");
        break;
      case philox::Dist::integer:
        p.low = at.i("low");
        p.range = static_cast<uint64_t>(at.i("high")) - static_cast<uint64_t>(at.i("low"));
        break;
    }
    return p;
  }
};

}  // namespace kiln
