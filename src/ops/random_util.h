// What the random kernels of every backend read from a random op's node besides its params
// (ops/random_params.h): the distribution, the state words and the next state (ops/random.cpp
// documents the attributes).
#pragma once

#include <cstdint>

#include "core/op_id.h"
#include "kiln/dtype.h"
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

/// Whether a group holds 2 outputs (f64 values, 64-bit integers) rather than 4.
inline bool is_wide(philox::Dist d, DType t) {
  if (t == f64) return true;
  return (t == i64 || t == u64) && d == philox::Dist::integer;
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
