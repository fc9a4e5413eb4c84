// ONNX random ops: RandomUniform, RandomNormal, their *Like forms, Bernoulli and Dropout's
// training-mode mask (ops_nn.cpp), on kiln's Philox ops (include/kiln/ops/random.h). The float
// `seed` attribute's bits seed the state (Dropout's int seed its value); a node without one is
// seeded from its first output's name, so each node draws its own numbers and every import of a
// model draws the same ones. The values differ from other runtimes' generators.
#include <onnx/onnx_pb.h>

#include <cstring>

#include "io/onnx/map_util.h"
#include "kiln/ops/random.h"

namespace kiln::onnx::detail {

namespace {

// (Dropout's seed attribute is an int, the random ops' a float)
Tensor state_for(NodeContext& c, bool int_seed = false) {
  uint64_t s0 = 0, s1 = 1;
  if (c.has_attr("seed") && int_seed) {
    s0 = static_cast<uint64_t>(c.attr_int("seed", 0));
    s1 = 3;
  } else if (c.has_attr("seed")) {
    const float f = c.attr_float("seed", 0);
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    s0 = bits;
  } else {
    // FNV-1a of the output name
    s0 = 0xcbf29ce484222325ull;
    for (unsigned char ch : c.proto().output(0)) s0 = (s0 ^ ch) * 0x100000001b3ull;
    s1 = 2;
  }
  return random_philox_state(c.graph(), static_cast<int64_t>(s0), static_cast<int64_t>(s1));
}

DType dtype_attr(NodeContext& c, DType fallback) {
  if (!c.has_attr("dtype")) return fallback;
  const auto t = from_onnx_dtype(static_cast<int32_t>(c.attr_int("dtype", 1)));
  if (!t || !is_floating(*t)) c.unsupported("dtype must be a float type");
  return *t;
}

Shape shape_of_like(NodeContext& c) {
  const Shape s = c.input(0).shape();
  for (int64_t d : s)
    if (d < 0) c.unsupported("needs the input's static shape while importing");
  return s;
}

template <bool Normal, bool Like>
Outs random_op(NodeContext& c) {
  const Shape shape = Like ? shape_of_like(c) : Shape(c.attr_ints("shape"));
  if (!Like && !c.has_attr("shape")) c.fail("the shape attribute is required");
  const DType t = dtype_attr(c, Like ? c.input(0).dtype() : f32);
  if (Like && !is_floating(t)) c.unsupported("dtype must be a float type");
  Tensor s = state_for(c);
  if (Normal)
    return {random_normal(s, shape, c.attr_float("mean", 0), c.attr_float("scale", 1), t).values};
  return {random_uniform(s, shape, c.attr_float("low", 0), c.attr_float("high", 1), t).values};
}

// 1 where a uniform draw is below the input's probability.
Outs bernoulli_op(NodeContext& c) {
  Tensor p = c.input(0);
  if (!is_floating(p.dtype())) c.fail("input must be a float tensor of probabilities");
  DType t = p.dtype();
  if (c.has_attr("dtype")) {
    const auto d = from_onnx_dtype(static_cast<int32_t>(c.attr_int("dtype", 1)));
    if (!d) c.unsupported("dtype is not a kiln element type");
    t = *d;
  }
  Tensor u = random_uniform(state_for(c), shape_of_like(c), 0, 1, p.dtype()).values;
  return {cast(less(u, p), t)};
}

}  // namespace

Tensor training_dropout_mask(NodeContext& c, const Shape& shape, double keep, DType dtype) {
  return random_dropout_mask(state_for(c, true), shape, keep, dtype).values;
}

void add_random_ops(std::vector<OpEntry>& t) {
  t.insert(t.end(), {
                        {"RandomUniform", 1, random_op<false, false>},
                        {"RandomNormal", 1, random_op<true, false>},
                        {"RandomUniformLike", 1, random_op<false, true>},
                        {"RandomNormalLike", 1, random_op<true, true>},
                        {"Bernoulli", 15, bernoulli_op},
                    });
}

}  // namespace kiln::onnx::detail
