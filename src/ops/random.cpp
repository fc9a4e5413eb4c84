// Random ops (include/kiln/ops/random.h); the generator and distributions: ops/philox.h.
//   random_philox_state:  no inputs; attrs state (6 ints: counter words 0-3, key words 0-1,
//                         each in [0, 2^32)). Output i32 [6].
//   random_<dist>:        input state (i32 [6]); attrs shape, dtype and the distribution's:
//     uniform:            a = min, b = max
//     normal:             a = mean, b = std
//     truncated_normal:   a = mean, b = std, lo/hi = accepted standard-normal range (open),
//                         min/max = clamp of the result (absolute; +-inf for none)
//     bernoulli:          p
//     dropout_mask:       p = keep probability
//     integer:            low, high
//   Outputs (values, next state). Pure: the same state gives the same values.
#include "kiln/ops/random.h"

#include <cmath>
#include <limits>

#include "ops/common.h"
#include "ops/philox.h"
#include "ops/random_params.h"

namespace kiln {

using namespace ops;

namespace {

void check_state(const InferContext& ctx) {
  const TensorInfo& s = ctx.inputs[0];
  if (s.dtype != i32 || !shapes_match(s.shape, {6}))
    fail<ValueError>(
        "[{}] state must be an i32 tensor of shape (6) (random_philox_state), got "
        "{} {}",
        ctx.name(), name(s.dtype), str(s.shape));
}

void check_finite(const InferContext& ctx, const char* what, double v) {
  if (!std::isfinite(v)) fail<ValueError>("[{}] {} must be finite, got {}", ctx.name(), what, v);
}

std::vector<TensorInfo> infer_state(const InferContext& ctx) {
  const auto& w = ctx.attrs.ints("state");
  if (w.size() != 6)
    fail<ValueError>("[random_philox_state] state attribute has {} words; 6 expected", w.size());
  for (int64_t x : w)
    if (x < 0 || x > 0xffffffffll)
      fail<ValueError>("[random_philox_state] state word {} is not a uint32", x);
  return {{{6}, i32}};
}

// Probability that a standard normal falls in (lo, hi).
double normal_mass(double lo, double hi) {
  return 0.5 * (std::erfc(-hi / std::sqrt(2.0)) - std::erfc(-lo / std::sqrt(2.0)));
}

std::vector<TensorInfo> infer_random(const InferContext& ctx) {
  check_state(ctx);
  const Attrs& a = ctx.attrs;
  const Shape& shape = a.ints("shape");
  for (int64_t d : shape)
    if (d < 0)
      fail<ShapeError>("[{}] shape {} must be static and non-negative", ctx.name(), str(shape));
  const DType t = a.dtype("dtype");
  switch (ctx.op) {
    case OpId::RandomUniform:
      if (!is_floating(t))
        fail<DTypeError>("[{}] dtype {} is not a float dtype", ctx.name(), name(t));
      check_finite(ctx, "min", a.f("a"));
      check_finite(ctx, "max", a.f("b"));
      if (a.f("a") > a.f("b"))
        fail<ValueError>("[{}] min {} is greater than max {}", ctx.name(), a.f("a"), a.f("b"));
      break;
    case OpId::RandomNormal:
    case OpId::RandomTruncatedNormal:
      if (!is_floating(t))
        fail<DTypeError>("[{}] dtype {} is not a float dtype", ctx.name(), name(t));
      check_finite(ctx, "mean", a.f("a"));
      check_finite(ctx, "std", a.f("b"));
      if (!(a.f("b") > 0))
        fail<ValueError>("[{}] std must be positive, got {}", ctx.name(), a.f("b"));
      if (ctx.op == OpId::RandomTruncatedNormal) {
        const double lo = a.f("lo"), hi = a.f("hi");
        if (!(lo < hi) || std::isnan(a.f("min")) || std::isnan(a.f("max")) ||
            !(a.f("min") < a.f("max")))
          fail<ValueError>("[{}] min {} must be below max {}", ctx.name(), a.f("min"), a.f("max"));
        if (!(normal_mass(lo, hi) >= 1e-3))
          fail<ValueError>(
              "[{}] [{}, {}] holds {} of the normal's probability (at least 0.001 "
              "needed for rejection sampling)",
              ctx.name(), a.f("min"), a.f("max"), normal_mass(lo, hi));
      }
      break;
    case OpId::RandomBernoulli:
      if (!(a.f("p") >= 0 && a.f("p") <= 1))
        fail<ValueError>("[{}] p must be in [0, 1], got {}", ctx.name(), a.f("p"));
      break;
    case OpId::RandomDropoutMask:
      if (!(a.f("p") > 0 && a.f("p") <= 1))
        fail<ValueError>("[{}] keep probability must be in (0, 1], got {}", ctx.name(), a.f("p"));
      if (!is_floating(t) && t != boolean)
        fail<DTypeError>("[{}] dtype {} is neither a float dtype nor bool", ctx.name(), name(t));
      break;
    case OpId::RandomInteger: {
      if (!is_integer(t))
        fail<DTypeError>("[{}] dtype {} is not an integer dtype", ctx.name(), name(t));
      const int64_t low = a.i("low"), high = a.i("high");
      int64_t tmin = 0, tmax = 0;
      switch (t) {
        case i8:
          tmin = INT8_MIN, tmax = INT8_MAX;
          break;
        case u8:
          tmin = 0, tmax = UINT8_MAX;
          break;
        case i16:
          tmin = INT16_MIN, tmax = INT16_MAX;
          break;
        case i32:
          tmin = INT32_MIN, tmax = INT32_MAX;
          break;
        case u16:
          tmin = 0, tmax = UINT16_MAX;
          break;
        case u32:
          tmin = 0, tmax = UINT32_MAX;
          break;
        case u64:  // (low and high are i64 attributes: draws stay below 2^63)
          tmin = 0, tmax = INT64_MAX;
          break;
        default:
          tmin = INT64_MIN, tmax = INT64_MAX;
          break;
      }
      if (!(low < high))
        fail<ValueError>("[{}] low {} must be below high {}", ctx.name(), low, high);
      // high is exclusive: high - 1 must fit; 32-bit draws need a range below 2^32
      if (low < tmin || high - 1 > tmax)
        fail<ValueError>("[{}] [{}, {}) does not fit dtype {}", ctx.name(), low, high, name(t));
      if (t != i64 && t != u64 &&
          static_cast<uint64_t>(high) - static_cast<uint64_t>(low) > 0xffffffffull)
        fail<ValueError>("[{}] range [{}, {}) is too wide for dtype {}", ctx.name(), low, high,
                         name(t));
      break;
    }
    default:
      break;
  }
  return {{shape, t}, {{6}, i32}};
}

Attrs base_attrs(const Shape& shape, DType dtype) {
  for (int64_t d : shape)
    if (d < 0) fail<ShapeError>("[random] shape {} must be static and non-negative", str(shape));
  return Attrs{{"shape", shape}, {"dtype", dtype}};
}

RandomResult draw(OpId op, const Tensor& state, Attrs attrs) {
  auto out = make_node(op, {state}, std::move(attrs));
  return {out[0], out[1]};
}

Tensor state_node(Graph& g, const philox::Block& ctr, const philox::Key& key) {
  std::vector<int64_t> w{ctr.w[0], ctr.w[1], ctr.w[2], ctr.w[3], key.w[0], key.w[1]};
  return detail::make_source_node(g.impl(), OpId::RandomPhiloxState, {{"state", w}})[0];
}

}  // namespace

void register_random_ops() {
  define_op(OpId::RandomPhiloxState)
      .set_infer(infer_state)
      .not_differentiable()
      .inputs(0)
      .params<PhiloxStateParams>();
  for (OpId op : {OpId::RandomUniform, OpId::RandomNormal, OpId::RandomTruncatedNormal,
                  OpId::RandomBernoulli, OpId::RandomDropoutMask, OpId::RandomInteger})
    define_op(op).set_infer(infer_random).not_differentiable().inputs(1).params<RandomParams>();
  // its bounds span all of int64
  define_op(OpId::RandomInteger).wide_ints({"low", "high"});
}

Tensor random_philox_state(Graph& g, int64_t seed0, int64_t seed1) {
  philox::Key key;
  philox::Block ctr;
  philox::key_counter_from_seed(static_cast<uint64_t>(seed0), static_cast<uint64_t>(seed1), key,
                                ctr);
  return state_node(g, ctr, key);
}

Tensor random_philox_state_from(Graph& g, uint64_t counter_low, uint64_t counter_high,
                                uint64_t key) {
  auto lo32 = [](uint64_t v) { return static_cast<uint32_t>(v); };
  auto hi32 = [](uint64_t v) { return static_cast<uint32_t>(v >> 32); };
  return state_node(
      g,
      philox::Block{{lo32(counter_low), hi32(counter_low), lo32(counter_high), hi32(counter_high)}},
      philox::Key{{lo32(key), hi32(key)}});
}

RandomResult random_uniform(const Tensor& state, const Shape& shape, double min, double max,
                            DType dtype) {
  Attrs a = base_attrs(shape, dtype);
  a.set("a", min).set("b", max);
  return draw(OpId::RandomUniform, state, std::move(a));
}

RandomResult random_normal(const Tensor& state, const Shape& shape, double mean, double std,
                           DType dtype) {
  Attrs a = base_attrs(shape, dtype);
  a.set("a", mean).set("b", std);
  return draw(OpId::RandomNormal, state, std::move(a));
}

RandomResult random_truncated_normal(const Tensor& state, const Shape& shape, double mean,
                                     double std, double min, double max, DType dtype) {
  Attrs a = base_attrs(shape, dtype);
  a.set("a", mean).set("b", std).set("min", min).set("max", max);
  a.set("lo", (min - mean) / std).set("hi", (max - mean) / std);
  return draw(OpId::RandomTruncatedNormal, state, std::move(a));
}

RandomResult random_bernoulli(const Tensor& state, const Shape& shape, double p, DType dtype) {
  Attrs a = base_attrs(shape, dtype);
  a.set("p", p);
  return draw(OpId::RandomBernoulli, state, std::move(a));
}

RandomResult random_dropout_mask(const Tensor& state, const Shape& shape, double keep,
                                 DType dtype) {
  Attrs a = base_attrs(shape, dtype);
  a.set("p", keep);
  return draw(OpId::RandomDropoutMask, state, std::move(a));
}

RandomResult random_integer(const Tensor& state, const Shape& shape, int64_t low, int64_t high,
                            DType dtype) {
  Attrs a = base_attrs(shape, dtype);
  a.set("low", low).set("high", high);
  return draw(OpId::RandomInteger, state, std::move(a));
}

Tensor stateless_uniform(Graph& g, const Shape& shape, std::array<int64_t, 2> seed, double min,
                         double max, DType dtype) {
  return random_uniform(random_philox_state(g, seed[0], seed[1]), shape, min, max, dtype).values;
}

Tensor stateless_normal(Graph& g, const Shape& shape, std::array<int64_t, 2> seed, double mean,
                        double std, DType dtype) {
  return random_normal(random_philox_state(g, seed[0], seed[1]), shape, mean, std, dtype).values;
}

Tensor stateless_truncated_normal(Graph& g, const Shape& shape, std::array<int64_t, 2> seed,
                                  double mean, double std, DType dtype) {
  // TensorFlow: standard normals in (-2, 2), then * std + mean, with no clamp
  Attrs a = base_attrs(shape, dtype);
  const double inf = std::numeric_limits<double>::infinity();
  a.set("a", mean).set("b", std).set("min", -inf).set("max", inf).set("lo", -2.0).set("hi", 2.0);
  return draw(OpId::RandomTruncatedNormal, random_philox_state(g, seed[0], seed[1]), std::move(a))
      .values;
}

}  // namespace kiln
