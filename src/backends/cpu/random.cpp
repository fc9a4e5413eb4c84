// CPU kernels of the random ops (ops/random.cpp): groups of outputs split over the pool; group g
// reads the Philox block(s) at its own counter, so the bits do not depend on the thread count.
#include <cstring>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/kernels.h"
#include "ops/random_params.h"
#include "ops/random_util.h"

namespace kiln::cpu {

namespace {

using philox::Dist;

void philox_state(KernelContext& ctx) {
  const PhiloxStateParams p = params_of<PhiloxStateParams>(ctx);
  int32_t* o = ctx.out(0).ptr<int32_t>();
  for (int i = 0; i < 6; ++i) o[i] = p.state[i];
}

// Runs group(g, out + g * size, count) for every group of n outputs, in parallel.
template <typename T, typename F>
void for_groups(KernelContext& ctx, int64_t n, int size, F&& f) {
  T* out = ctx.out(0).ptr<T>();
  const int64_t groups = (n + size - 1) / size;
  ctx.parallel_for(groups, 1024, [&](int64_t b, int64_t e) {
    for (int64_t g = b; g < e; ++g)
      f(static_cast<uint64_t>(g), out + g * size,
        static_cast<int>(std::min<int64_t>(size, n - g * size)));
  });
}

void random_draw(KernelContext& ctx) {
  const Dist d = random_util::dist_of(ctx.op());
  const TensorView& v = ctx.out(0);
  const int64_t n = v.numel();
  const int32_t* s = ctx.in(0).ptr<int32_t>();
  philox::Block ctr;
  philox::Key key;
  random_util::unpack(s, ctr, key);
  const int size = philox::group_size(random_util::is_wide(d, v.dtype));
  const RandomParams rp = params_of<RandomParams>(ctx);
  if (is_floating(v.dtype)) {
    dispatch_float(v.dtype, ctx.op_name(), [&](auto t) {
      using T = decltype(t);
      const auto p = rp.params<T>(d);
      for_groups<T>(ctx, n, size, [&](uint64_t g, T* o, int count) {
        philox::real_group<T>(d, p, ctr, key, g, o, count);
      });
    });
  } else {
    const auto p = rp.params<float>(d);
    dispatch(v.dtype, ctx.op_name(), [&](auto t) {
      using T = decltype(t);
      for_groups<T>(ctx, n, size, [&](uint64_t g, T* o, int count) {
        philox::integer_group<T>(d, p, ctr, key, g, o, count);
      });
    });
  }
  // the state may share no buffer with the values; read it before writing the next one
  int32_t next[6];
  random_util::next_state(s, d, v.dtype, n, next);
  std::memcpy(ctx.out(1).ptr<int32_t>(), next, sizeof next);
}

}  // namespace

void register_random_kernels() {
  register_kernel(OpId::RandomPhiloxState, Backend::cpu, {philox_state, DTypeSet{i32}, -1});
  for (OpId op : {OpId::RandomUniform, OpId::RandomNormal, OpId::RandomTruncatedNormal})
    register_kernel(op, Backend::cpu, {random_draw, kFloatTypes, -1});
  register_kernel(OpId::RandomBernoulli, Backend::cpu, {random_draw, kAllTypes, -1});
  register_kernel(OpId::RandomDropoutMask, Backend::cpu,
                  {random_draw, kFloatTypes | DTypeSet{boolean}, -1});
  register_kernel(OpId::RandomInteger, Backend::cpu, {random_draw, kIntTypes, -1});
}

}  // namespace kiln::cpu
