// CPU kernels of the elementwise family: one kernel template for every record of op_list.inc
// (its math is src/ops/elementwise_math.h), and the ops that are not records: where, cast and
// bit_shift here, gelu, clip and the vectorized f32 activations in elementwise_unary.cpp.
#include "backends/cpu/elementwise.h"

#include <cmath>
#include <cstdint>

#include "backends/cpu/kernels.h"
#include "ops/elementwise_params.h"
#include "ops/elementwise_records.h"

namespace kiln::cpu {

namespace {
// The kernel of a record of op_list.inc (src/ops/elementwise_records.h): its functor Op over the
// dtypes the record names, with the record's float attributes as the functor's members.
template <template <class> class Op, int Arity, math::Result R, math::Types C, int NumAttrs>
void record_kernel(KernelContext& ctx) {
  using math::Result;
  using math::Types;
  if constexpr (Arity == 2) {
    if constexpr (C == Types::boolean)
      binary_map<bool, bool, bool>(ctx, ctx.in(0), ctx.in(1), ctx.out(0), Op<bool>{});
    else if constexpr (R == Result::boolean) compare_op<Op>(ctx);
    else if constexpr (C == Types::integer) integer_op<Op>(ctx);
    else binary_op<Op>(ctx);
  } else if constexpr (C == Types::boolean) {
    unary_map(ctx, ctx.in(0).ptr<bool>(), ctx.out(0).ptr<bool>(), ctx.in(0).numel(), Op<bool>{});
  } else if constexpr (R == Result::boolean) {
    dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
      using T = decltype(t);
      unary_map(ctx, ctx.in(0).ptr<T>(), ctx.out(0).ptr<bool>(), ctx.in(0).numel(), Op<T>{});
    });
  } else if constexpr (C == Types::integer) {
    dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
      using T = decltype(t);
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
        unary_map(ctx, ctx.in(0).ptr<T>(), ctx.out(0).ptr<T>(), ctx.in(0).numel(), Op<T>{});
    });
  } else if constexpr (C == Types::floating) {
    math::with_attrs<NumAttrs>(ctx, [&](auto... a) { float_op<Op>(ctx, a...); });
  } else {
    unary_op<Op>(ctx);
  }
}

// where only moves bytes, so it runs on an unsigned type of the element's size (f16 included).
template <typename T> void where_typed(KernelContext& ctx) {
  const TensorView &c = ctx.in(0), &x = ctx.in(1), &y = ctx.in(2), &o = ctx.out(0);
  const bool* pc = c.ptr<bool>();
  const T *px = x.ptr<T>(), *py = y.ptr<T>();
  T* po = o.ptr<T>();
  if (c.shape == o.shape && x.shape == o.shape && y.shape == o.shape) {
    ctx.parallel_for(o.numel(), 16384, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) po[i] = pc[i] ? px[i] : py[i];
    });
    return;
  }
  for_each_broadcast<3>(ctx, o.shape, {&c.shape, &x.shape, &y.shape},
                        [&](int64_t i, const std::array<int64_t, 3>& off) {
                          po[i] = pc[off[0]] ? px[off[1]] : py[off[2]];
                        });
}
void where(KernelContext& ctx) {
  switch (size_of(ctx.out(0).dtype)) {
    case 1: where_typed<uint8_t>(ctx); return;
    case 2: where_typed<uint16_t>(ctx); return;
    case 4: where_typed<uint32_t>(ctx); return;
    case 8: where_typed<uint64_t>(ctx); return;
    default: fail<UnsupportedError>("[where] cpu kernel got dtype {}", name(ctx.out(0).dtype));
  }
}

void cast(KernelContext& ctx) {
  const TensorView &i = ctx.in(0), &o = ctx.out(0);
  const narrow::Rules rules = params_of<CastParams>(ctx).rules;
  ctx.parallel_for(i.numel(), 65536, [&](int64_t b, int64_t e) {
    convert(static_cast<char*>(i.data) + b * size_of(i.dtype), i.dtype,
            static_cast<char*>(o.data) + b * size_of(o.dtype), o.dtype, e - b, rules.saturate,
            rules.round);
  });
}

// The shift direction is an attribute, so bit_shift is not a record: one of two functors.
void bit_shift(KernelContext& ctx) {
  if (params_of<BitShiftParams>(ctx).left) integer_op<math::ShiftLeft>(ctx);
  else integer_op<math::ShiftRight>(ctx);
}
}  // namespace

void register_elementwise_kernels() {
  // f16/bf16 reach the float math as f32 (KernelEntry::half_via_f32)
  constexpr auto cpu_types = [](math::Types t) {
    return t == math::Types::floating ? DTypeSet{f32, f64} : math::dtypes(t);
  };
#define KILN_OP(P, s, id, family)
#define KILN_EW(P, s, id, arity, result, types, k0, k1)                                       \
  register_kernel(OpId::P, Backend::cpu,                                                      \
                  {record_kernel<math::P, arity, math::record_tokens::result,                 \
                                 math::record_tokens::KILN_EW_TYPES_##types,                  \
                                 math::record(OpId::P)->num_attrs()>,                         \
                   cpu_types(math::record_tokens::KILN_EW_TYPES_##types)});
#include "ops/op_list.inc"
#undef KILN_OP
#undef KILN_EW
  register_kernel(OpId::Where, Backend::cpu, {where, kAllTypes, 1, false});
  register_kernel(OpId::Cast, Backend::cpu, {cast, kAllTypes | kNarrowTypes, 0, false});
  register_kernel(OpId::BitShift, Backend::cpu, {bit_shift, kIntTypes});
  register_elementwise_unary_kernels();
}

}  // namespace kiln::cpu
