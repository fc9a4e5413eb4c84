// CUDA kernels of the elementwise family over the launchers of elementwise.cuh: one kernel
// template for every record of op_list.inc, whose math is src/ops/elementwise_math.h (the CPU
// and fused kernels run the same functors), and where, cast, clip, gelu and bit_shift. f16/bf16
// compute in f32, as the CPU kernels do.
#include <cmath>
#include <limits>
#include <type_traits>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/elementwise.cuh"
#include "backends/cuda/kernels.h"
#include "kiln/narrow.h"
#include "ops/elementwise_math.h"
#include "ops/elementwise_params.h"
#include "ops/elementwise_records.h"

namespace kiln::cuda {

namespace {
using ew::Acc1;
using ew::Acc2;
using ew::unary_float;

[[noreturn]] void bad_dtype(const KernelContext& ctx, DType t) {
  fail<UnsupportedError>("[{}] cuda kernel got dtype {}", ctx.op_name(), name(t));
}

// out = Op(a, b) in the dtype of the inputs (bool excluded).
template <template <typename> class Op> void binary_same(KernelContext& ctx) {
  const DType dt = ctx.in(0).dtype;
  dispatch(dt, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_same_v<T, bool>) {
      bad_dtype(ctx, dt);
    } else {
      using F = Op<acc_t<T>>;
      ew::launch_binary<T, T, T>(ctx.in(0), ctx.in(1), ctx.out(0), Acc2<T, F>{F{}}, stream_of(ctx),
                                 ctx.op_name());
    }
  });
}

// out (bool) = Op(a, b) for inputs of any dtype.
template <template <typename> class Op> void compare(KernelContext& ctx) {
  dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    using F = Op<acc_t<T>>;
    ew::launch_binary<T, T, bool>(ctx.in(0), ctx.in(1), ctx.out(0), Acc2<bool, F>{F{}},
                                  stream_of(ctx), ctx.op_name());
  });
}

template <typename T> constexpr bool kInt = std::is_integral_v<T> && !std::is_same_v<T, bool>;

// out = Op(a, b) or Op(x) for integer dtypes, broadcasting.
template <template <typename> class Op, int Arity> void integer(KernelContext& ctx) {
  const DType dt = ctx.in(0).dtype;
  dispatch(dt, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (!kInt<T>)
      bad_dtype(ctx, dt);
    else if constexpr (Arity == 2)
      ew::launch_binary<T, T, T>(ctx.in(0), ctx.in(1), ctx.out(0), Op<T>{}, stream_of(ctx),
                                 ctx.op_name());
    else
      ew::launch_unary<T, T>(ctx.in(0), ctx.out(0), Op<T>{}, stream_of(ctx), ctx.op_name());
  });
}

// out = Op(x) for numeric dtypes (bool excluded; unsigned too with kSigned, for the ops that
// take signed dtypes only).
template <template <typename> class Op, bool kSigned> void unary_same(KernelContext& ctx) {
  const DType dt = ctx.in(0).dtype;
  dispatch(dt, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_same_v<T, bool> || (kSigned && std::is_unsigned_v<T>)) {
      bad_dtype(ctx, dt);
    } else {
      using A = acc_t<T>;
      ew::launch_unary<T, T>(ctx.in(0), ctx.out(0), Acc1<T, Op<A>>{Op<A>{}}, stream_of(ctx),
                             ctx.op_name());
    }
  });
}

// Integers are never NaN or infinite.
template <template <typename> class Op> void classify(KernelContext& ctx) {
  const TensorView &i = ctx.in(0), &o = ctx.out(0);
  dispatch(i.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_floating_point_v<acc_t<T>>) {
      using F = Op<acc_t<T>>;
      ew::launch_unary<T, bool>(i, o, Acc1<bool, F>{F{}}, stream_of(ctx), ctx.op_name());
    } else if (o.numel() > 0) {
      KILN_CUDA_CHECK(cudaMemsetAsync(o.data, 0, static_cast<size_t>(o.numel()), stream_of(ctx)));
    }
  });
}

// The kernel of a record of op_list.inc (src/ops/elementwise_records.h): its functor Op over the
// dtypes the record names, with the record's float attributes as the functor's members.
template <template <class> class Op, int Arity, math::Result R, math::Types C, int NumAttrs>
void record_kernel(KernelContext& ctx) {
  using math::Result;
  using math::Types;
  if constexpr (C == Types::boolean && Arity == 2) {
    ew::launch_binary<bool, bool, bool>(ctx.in(0), ctx.in(1), ctx.out(0), Op<bool>{},
                                        stream_of(ctx), ctx.op_name());
  } else if constexpr (C == Types::boolean) {
    ew::launch_unary<bool, bool>(ctx.in(0), ctx.out(0), Op<bool>{}, stream_of(ctx), ctx.op_name());
  } else if constexpr (C == Types::integer) {
    integer<Op, Arity>(ctx);
  } else if constexpr (Arity == 2 && R == Result::boolean) {
    compare<Op>(ctx);
  } else if constexpr (Arity == 2) {
    binary_same<Op>(ctx);
  } else if constexpr (R == Result::boolean) {
    classify<Op>(ctx);
  } else if constexpr (C == Types::floating) {
    math::with_attrs<NumAttrs>(ctx, [&](auto... a) { unary_float<Op>(ctx, a...); });
  } else {
    unary_same<Op, C == Types::signed_numeric>(ctx);
  }
}

// where only moves bytes, so it runs on an unsigned type of the element's size.
void where(KernelContext& ctx) {
  const TensorView &c = ctx.in(0), &x = ctx.in(1), &y = ctx.in(2), &o = ctx.out(0);
  cudaStream_t s = stream_of(ctx);
  switch (size_of(o.dtype)) {
    case 1: ew::launch_where<uint8_t>(c, x, y, o, s, "where"); return;
    case 2: ew::launch_where<uint16_t>(c, x, y, o, s, "where"); return;
    case 4: ew::launch_where<uint32_t>(c, x, y, o, s, "where"); return;
    case 8: ew::launch_where<uint64_t>(c, x, y, o, s, "where"); return;
    default: bad_dtype(ctx, o.dtype);
  }
}

template <typename S, typename D> struct CastF {
  __device__ D operator()(S v) const { return ew::convert_value<S, D>(v); }
};

// To and from the narrow types, through f32 (kiln/narrow.h), as the CPU's convert.
template <typename S> struct EncodeNarrow {
  narrow::Codec to;
  narrow::Rules rules;
  __device__ uint8_t operator()(S v) const {
    if constexpr (std::is_same_v<S, double>) return narrow::encode(v, to, rules);  // (rounded once)
    else return narrow::encode(ew::convert_value<S, float>(v), to, rules);
  }
};
template <typename D> struct DecodeNarrow {
  narrow::Codec from;
  __device__ D operator()(uint8_t b) const {
    return ew::convert_value<float, D>(narrow::decode(b, from));
  }
};
struct RecodeNarrow {
  narrow::Codec from, to;
  narrow::Rules rules;
  __device__ uint8_t operator()(uint8_t b) const {
    return narrow::encode(narrow::decode(b, from), to, rules);
  }
};

void cast_narrow(const TensorView& i, const TensorView& o, const narrow::Rules& rules,
                 cudaStream_t s) {
  if (is_narrow(i.dtype) && is_narrow(o.dtype)) {
    ew::launch_unary<uint8_t, uint8_t>(
        i, o, RecodeNarrow{narrow::codec(i.dtype), narrow::codec(o.dtype), rules}, s, "cast");
  } else if (is_narrow(o.dtype)) {
    dispatch(i.dtype, "cast", [&](auto st) {
      using S = decltype(st);
      ew::launch_unary<S, uint8_t>(i, o, EncodeNarrow<S>{narrow::codec(o.dtype), rules}, s, "cast");
    });
  } else {
    dispatch(o.dtype, "cast", [&](auto dt) {
      using D = decltype(dt);
      ew::launch_unary<uint8_t, D>(i, o, DecodeNarrow<D>{narrow::codec(i.dtype)}, s, "cast");
    });
  }
}

void cast(KernelContext& ctx) {
  const TensorView &i = ctx.in(0), &o = ctx.out(0);
  const int64_t n = i.numel();
  if (n == 0) return;
  cudaStream_t s = stream_of(ctx);
  if (i.dtype == o.dtype) {
    if (i.data != o.data)
      KILN_CUDA_CHECK(cudaMemcpyAsync(o.data, i.data, static_cast<size_t>(n) * size_of(i.dtype),
                                      cudaMemcpyDeviceToDevice, s));
    return;
  }
  if (is_narrow(i.dtype) || is_narrow(o.dtype)) {
    cast_narrow(i, o, params_of<CastParams>(ctx).rules, s);
    return;
  }
  dispatch(i.dtype, "cast", [&](auto st) {
    using S = decltype(st);
    dispatch(o.dtype, "cast", [&](auto dt) {
      using D = decltype(dt);
      if constexpr (!std::is_same_v<S, D>) ew::launch_unary<S, D>(i, o, CastF<S, D>{}, s, "cast");
    });
  });
}

void clip(KernelContext& ctx) {
  const math::ClipParams bounds = params_of<math::ClipParams>(ctx);
  const double lo = bounds.lo, hi = bounds.hi;
  const DType dt = ctx.in(0).dtype;
  dispatch(dt, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    using A = acc_t<T>;
    if constexpr (std::is_same_v<T, bool>) {
      bad_dtype(ctx, dt);
    } else {
      const math::Clip<A> f{math::clip_bound<A>(lo, false), math::clip_bound<A>(hi, true)};
      ew::launch_unary<T, T>(ctx.in(0), ctx.out(0), Acc1<T, math::Clip<A>>{f}, stream_of(ctx),
                             "clip");
    }
  });
}

void gelu(KernelContext& ctx) {
  if (params_of<GeluParams>(ctx).tanh) unary_float<math::GeluTanh>(ctx);
  else unary_float<math::Gelu>(ctx);
}
// The shift direction is an attribute, so bit_shift is not a record: one of two functors.
void bit_shift(KernelContext& ctx) {
  if (params_of<BitShiftParams>(ctx).left) integer<math::ShiftLeft, 2>(ctx);
  else integer<math::ShiftRight, 2>(ctx);
}
}  // namespace

void register_elementwise_kernels() {
#define KILN_OP(P, s, id, family)
#define KILN_EW(P, s, id, arity, result, types, k0, k1)                                   \
  register_kernel(OpId::P, Backend::cuda,                                                 \
                  {record_kernel<math::P, arity, math::record_tokens::result,             \
                                 math::record_tokens::KILN_EW_TYPES_##types,              \
                                 math::record(OpId::P)->num_attrs()>,                     \
                   math::dtypes(math::record_tokens::KILN_EW_TYPES_##types), 0, false});
#include "ops/op_list.inc"
#undef KILN_OP
#undef KILN_EW
  const auto reg = [](OpId op, KernelFn fn, DTypeSet types, int dtype_input = 0) {
    register_kernel(op, Backend::cuda, {fn, types, dtype_input, false});
  };
  reg(OpId::Where, where, kAllTypes, 1);
  reg(OpId::Cast, cast, kAllTypes | kNarrowTypes);
  reg(OpId::Clip, clip, kNumericTypes);
  reg(OpId::Gelu, gelu, kFloatTypes);
  reg(OpId::BitShift, bit_shift, kIntTypes);
}

}  // namespace kiln::cuda
