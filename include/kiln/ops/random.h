// Random numbers: Philox4x32-10 state tensors, stateful random ops (MPSGraph's), and stateless
// ops equal bit for bit to TensorFlow's tf.random.stateless_* for f32.
//
// A state is an i32 tensor of shape [6] holding uint32 words: counter (128 bits, word 0 lowest)
// then key (64 bits, word 4 lowest). A random op reads the state and returns its values and the
// next state: the counter advanced past the Philox blocks the draw used. Output element i comes
// from the block at counter + i / 4 (i / 2 for f64 values and i64 integers; truncated normal
// reserves 256 blocks per 4 outputs, 128 per 2 for f64), so the bits depend only on the state and
// the element index: the same on every backend, thread count and run. Random ops are not
// differentiable.
#pragma once

#include <array>
#include <cstdint>

#include "kiln/graph.h"

namespace kiln {

/// Values of a random op and the state to pass to the next one.
struct RandomResult {
  Tensor values;
  Tensor state;
};

/// The state TensorFlow's stateless ops derive from seed = [seed0, seed1] (its seed
/// scrambling), so random_uniform(random_philox_state(g, a, b), shape) equals
/// tf.random.stateless_uniform(shape, seed=[a, b]). Seeds are int64 (an int32 seed sign-extends,
/// as in TensorFlow).
Tensor random_philox_state(Graph& g, int64_t seed0, int64_t seed1 = 0);
/// A state with the given counter and key as they are (MPSGraph's
/// randomPhiloxStateTensorWithCounterLow:counterHigh:key:).
Tensor random_philox_state_from(Graph& g, uint64_t counter_low, uint64_t counter_high,
                                uint64_t key);

/// Uniform values in [min, max): u * (max - min) + min with u in [0, 1) (float types). Throws
/// ValueError for min > max or non-finite bounds. Returns (values, next state).
RandomResult random_uniform(const Tensor& state, const Shape& shape, double min = 0, double max = 1,
                            DType dtype = f32);
/// Normal values: z * std + mean with z from Box-Muller (float types). std > 0. Returns
/// (values, next state).
RandomResult random_normal(const Tensor& state, const Shape& shape, double mean = 0, double std = 1,
                           DType dtype = f32);
/// Normal values truncated to [min, max] (absolute bounds, as MPSGraph's descriptor) by
/// rejection: standard normals outside ((min - mean) / std, (max - mean) / std) are redrawn.
/// Throws ValueError for min >= max or when the range holds less than 0.1% of the probability.
/// Returns (values, next state).
RandomResult random_truncated_normal(const Tensor& state, const Shape& shape, double mean = 0,
                                     double std = 1, double min = -2, double max = 2,
                                     DType dtype = f32);
/// 1 with probability p, else 0 (any dtype; true/false for bool). p in [0, 1]. Returns
/// (values, next state).
RandomResult random_bernoulli(const Tensor& state, const Shape& shape, double p, DType dtype = f32);
/// A dropout mask keeping each element with probability `keep` in (0, 1]: 1 / keep for kept
/// elements and 0 for dropped ones in float types (x * mask is inverted dropout), true/false for
/// bool. Returns (mask, next state).
RandomResult random_dropout_mask(const Tensor& state, const Shape& shape, double keep,
                                 DType dtype = f32);
/// Integers in [low, high): low + bits % (high - low) (TensorFlow's rule; integer dtypes). Throws
/// ValueError unless low < high and both fit the dtype. Returns (values, next state).
RandomResult random_integer(const Tensor& state, const Shape& shape, int64_t low, int64_t high,
                            DType dtype = i32);

/// tf.random.stateless_uniform(shape, seed, minval=min, maxval=max, dtype) for float dtypes.
Tensor stateless_uniform(Graph& g, const Shape& shape, std::array<int64_t, 2> seed, double min = 0,
                         double max = 1, DType dtype = f32);
/// tf.random.stateless_normal(shape, seed, mean, stddev, dtype).
Tensor stateless_normal(Graph& g, const Shape& shape, std::array<int64_t, 2> seed, double mean = 0,
                        double std = 1, DType dtype = f32);
/// tf.random.stateless_truncated_normal(shape, seed, mean, stddev, dtype): standard normals in
/// (-2, 2), scaled.
Tensor stateless_truncated_normal(Graph& g, const Shape& shape, std::array<int64_t, 2> seed,
                                  double mean = 0, double std = 1, DType dtype = f32);

}  // namespace kiln
