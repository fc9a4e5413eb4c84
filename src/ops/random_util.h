// What the random kernels of every backend read from a random op's node: the state words, the
// distribution, its parameters and the next state (ops/random.cpp documents the attributes).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/op_id.h"
#include "kiln/attrs.h"
#include "ops/philox.h"

namespace kiln::random_util {

inline philox::Dist dist_of(OpId op) {
  switch (op) {
    case OpId::RandomNormal:
      return philox::Dist::normal;
    case OpId::RandomTruncatedNormal:
      return philox::Dist::truncated_normal;
    case OpId::RandomBernoulli:
      return philox::Dist::bernoulli;
    case OpId::RandomDropoutMask:
      return philox::Dist::dropout_mask;
    case OpId::RandomInteger:
      return philox::Dist::integer;
    default:
      return philox::Dist::uniform;
  }
}

/// Whether a group holds 2 outputs (f64 values, i64 integers) rather than 4.
inline bool is_wide(philox::Dist d, DType t) {
  if (t == f64) return true;
  return t == i64 && d == philox::Dist::integer;
}

/// The distribution's parameters in arithmetic type A.
template <typename A>
philox::Params<A> params(const Attrs& a, philox::Dist d) {
  philox::Params<A> p;
  switch (d) {
    case philox::Dist::uniform:
    case philox::Dist::normal:
      p.a = static_cast<A>(a.f("a"));
      p.b = static_cast<A>(a.f("b"));
      break;
    case philox::Dist::truncated_normal:
      p.a = static_cast<A>(a.f("a"));
      p.b = static_cast<A>(a.f("b"));
      p.lo = static_cast<A>(a.f("lo"));
      p.hi = static_cast<A>(a.f("hi"));
      p.min = static_cast<A>(a.f("min"));
      p.max = static_cast<A>(a.f("max"));
      break;
    case philox::Dist::bernoulli:
    case philox::Dist::dropout_mask:
      // x < p * 2^32 for a uint32 x: probability p, exact to 2^-32
      p.threshold = static_cast<uint64_t>(std::llround(std::ldexp(a.f("p"), 32)));
      p.scale = static_cast<A>(1.0 / a.f("p"));
      break;
    case philox::Dist::integer:
      p.low = a.i("low");
      p.range = static_cast<uint64_t>(a.i("high")) - static_cast<uint64_t>(a.i("low"));
      break;
  }
  return p;
}

/// The counter and key held in state words s[0..5].
inline void unpack(const int32_t* s, philox::Block& ctr, philox::Key& key) {
  for (int i = 0; i < 4; ++i) ctr.w[i] = static_cast<uint32_t>(s[i]);
  key.w[0] = static_cast<uint32_t>(s[4]);
  key.w[1] = static_cast<uint32_t>(s[5]);
}
/// The state after a draw of n outputs.
inline void next_state(const int32_t* s, philox::Dist d, DType t, int64_t n, int32_t* out) {
  philox::Block ctr;
  philox::Key key;
  unpack(s, ctr, key);
  ctr = philox::skip(ctr, philox::blocks_for(d, is_wide(d, t), n));
  for (int i = 0; i < 4; ++i) out[i] = static_cast<int32_t>(ctr.w[i]);
  out[4] = s[4];
  out[5] = s[5];
}

}  // namespace kiln::random_util
