// Cases of the random ops: a fed state (counter near a carry, any key), odd sizes, every dtype
// the op takes. Outputs agree exactly between backends except normals, whose log/sin/cos may
// round differently by 1 ulp (docs/random.md); the harness's float tolerance covers that.
#include <fmt/format.h>

#include "backend_ops/harness.h"
#include "kiln/ops/random.h"

namespace kiln::harness {
namespace {

const Shape kShapes[] = {{4099}, {3, 5, 7}, {0}};

// A fed state whose counter's low word wraps within the draw.
Tensor state(Case& c, int i) {
  const std::vector<double> w = {4294967000.0 - 1000.0 * i, 4294967295.0, 17, 0, 0x9e3779b9, 12345};
  return c.input({6}, i32, [w](const Shape& s) {
    Array a = Array::empty(s, i32);
    for (int k = 0; k < 6; ++k)
      a.data<int32_t>()[k] = static_cast<int32_t>(static_cast<uint32_t>(w[k]));
    return a;
  });
}

bool draw(Case& c, DType t, int i, OpId op) {
  const bool flt = is_floating(t);
  Tensor s = state(c, i);
  const Shape& shape = kShapes[i];
  RandomResult r;
  switch (op) {
    case OpId::RandomUniform:
      if (!flt) return false;
      r = random_uniform(s, shape, -2, 3, t);
      break;
    case OpId::RandomNormal:
      if (!flt) return false;
      r = random_normal(s, shape, 1, 2, t);
      break;
    case OpId::RandomTruncatedNormal:
      if (!flt) return false;
      r = random_truncated_normal(s, shape, 0, 1, -1, 2, t);
      break;
    case OpId::RandomBernoulli:
      r = random_bernoulli(s, shape, 0.35, t);
      break;
    case OpId::RandomDropoutMask:
      if (!flt && t != boolean) return false;
      r = random_dropout_mask(s, shape, 0.8, t);
      break;
    default:
      if (!is_integer(t)) return false;
      r = random_integer(s, shape, is_signed(t) ? -50 : 3, 100, t);
      break;
  }
  c.outs = {r.values, r.state};
  c.grad = false;
  c.note(fmt::format("{} shape {}", op_name(op), to_string(shape)));
  return true;
}

const bool kState =
    register_cases({OpId::RandomPhiloxState,
                    2,
                    [](Case& c, DType, int i) {
                      c.outs = {i == 0 ? random_philox_state(c.g, 7, -9)
                                       : random_philox_state_from(c.g, ~0ull, 1, 2)};
                      c.grad = false;
                      return true;
                    },
                    {i32}});

const std::vector<DType> kFloats = {f32, f16, bf16, f64};
const std::vector<DType> kInts = {i32, i64, i16, i8, u8, u16, u32, u64};

#define KILN_RANDOM_CASES(Op, types) \
  const bool k##Op = register_cases( \
      {OpId::Op, 3, [](Case& c, DType t, int i) { return draw(c, t, i, OpId::Op); }, types});
KILN_RANDOM_CASES(RandomUniform, kFloats)
KILN_RANDOM_CASES(RandomNormal, kFloats)
KILN_RANDOM_CASES(RandomTruncatedNormal, kFloats)
KILN_RANDOM_CASES(RandomBernoulli, (std::vector<DType>{f32, f16, bf16, f64, i32, i64, i16, i8, u8,
                                                       u16, u32, u64, boolean}))
KILN_RANDOM_CASES(RandomDropoutMask, (std::vector<DType>{f32, f16, bf16, f64, boolean}))
KILN_RANDOM_CASES(RandomInteger, kInts)
#undef KILN_RANDOM_CASES

}  // namespace
}  // namespace kiln::harness
