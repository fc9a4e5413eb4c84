// CUDA kernels of the random ops (ops/random.cpp): one thread per group of outputs (4, or 2 for
// f64 values and i64 integers), the same groups and Philox blocks as the CPU kernels. The state
// stays on the device: each thread reads it, and thread 0 writes the next one.
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernels.h"
#include "ops/random_params.h"
#include "ops/random_util.h"

namespace kiln::cuda {

namespace {

using philox::Dist;

struct StateWords {
  int32_t w[6];
};

__global__ void state_kernel(int32_t* out, StateWords s) {
  if (threadIdx.x < 6) out[threadIdx.x] = s.w[threadIdx.x];
}

void philox_state(KernelContext& ctx) {
  const PhiloxStateParams p = params_of<PhiloxStateParams>(ctx);
  StateWords s;
  for (int i = 0; i < 6; ++i) s.w[i] = p.state[i];
  state_kernel<<<1, 32, 0, stream_of(ctx)>>>(ctx.out(0).ptr<int32_t>(), s);
  check_launch(ctx.op_name());
}

// Writes the next state: the counter advanced by `blocks`.
__device__ void write_next(const int32_t* s, int32_t* next, uint64_t blocks) {
  philox::Block c{{static_cast<uint32_t>(s[0]), static_cast<uint32_t>(s[1]),
                   static_cast<uint32_t>(s[2]), static_cast<uint32_t>(s[3])}};
  c = philox::skip(c, blocks);
  for (int i = 0; i < 4; ++i) next[i] = static_cast<int32_t>(c.w[i]);
  next[4] = s[4];
  next[5] = s[5];
}

__device__ void read_state(const int32_t* s, philox::Block& ctr, philox::Key& key) {
  for (int i = 0; i < 4; ++i) ctr.w[i] = static_cast<uint32_t>(s[i]);
  key = philox::Key{{static_cast<uint32_t>(s[4]), static_cast<uint32_t>(s[5])}};
}

// Float values of T computed in A (float for half types).
template <typename T, typename A>
__global__ void real_kernel(Dist d, philox::Params<A> p, const int32_t* state, T* out,
                            int32_t* next, int64_t n, int size, uint64_t blocks) {
  philox::Block ctr;
  philox::Key key;
  read_state(state, ctr, key);
  const int64_t groups = (n + size - 1) / size;
  for (int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g < groups;
       g += int64_t{gridDim.x} * blockDim.x) {
    A v[4];
    const int count = static_cast<int>(min(int64_t{size}, n - g * size));
    philox::real_group<A>(d, p, ctr, key, static_cast<uint64_t>(g), v, count);
    for (int i = 0; i < count; ++i) out[g * size + i] = from_acc<T>(v[i]);
  }
  // every thread has read the state before this block's thread 0 may overwrite an aliased one;
  // the next state is a separate buffer (outputs never alias inputs here)
  if (blockIdx.x == 0 && threadIdx.x == 0) write_next(state, next, blocks);
}

template <typename T>
__global__ void int_kernel(Dist d, philox::Params<float> p, const int32_t* state, T* out,
                           int32_t* next, int64_t n, int size, uint64_t blocks) {
  philox::Block ctr;
  philox::Key key;
  read_state(state, ctr, key);
  const int64_t groups = (n + size - 1) / size;
  for (int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g < groups;
       g += int64_t{gridDim.x} * blockDim.x) {
    const int count = static_cast<int>(min(int64_t{size}, n - g * size));
    philox::integer_group<T>(d, p, ctr, key, static_cast<uint64_t>(g), out + g * size, count);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) write_next(state, next, blocks);
}

void random_draw(KernelContext& ctx) {
  const Dist d = random_util::dist_of(ctx.op());
  const TensorView& v = ctx.out(0);
  const int64_t n = v.numel();
  const bool wide = random_util::is_wide(d, v.dtype);
  const int size = philox::group_size(wide);
  const uint64_t blocks = philox::blocks_for(d, wide, n);
  const int64_t groups = (n + size - 1) / size;
  const int32_t* s = ctx.in(0).ptr<int32_t>();
  int32_t* next = ctx.out(1).ptr<int32_t>();
  cudaStream_t st = stream_of(ctx);
  const unsigned grid = blocks_for(groups);
  const RandomParams rp = params_of<RandomParams>(ctx);
  dispatch(v.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_floating_point_v<acc_t<T>>) {
      using A = acc_t<T>;
      const auto p = rp.params<A>(d);
      real_kernel<T, A><<<grid, kThreads, 0, st>>>(d, p, s, v.ptr<T>(), next, n, size, blocks);
    } else {
      const auto p = rp.params<float>(d);
      int_kernel<T><<<grid, kThreads, 0, st>>>(d, p, s, v.ptr<T>(), next, n, size, blocks);
    }
  });
  check_launch(ctx.op_name());
}

}  // namespace

void register_random_kernels() {
  register_kernel(OpId::RandomPhiloxState, Backend::cuda,
                  {philox_state, DTypeSet{i32}, -1, /*half_via_f32=*/false});
  auto reg = [](OpId op, DTypeSet types) {
    register_kernel(op, Backend::cuda, {random_draw, types, -1, /*half_via_f32=*/false});
  };
  for (OpId op : {OpId::RandomUniform, OpId::RandomNormal, OpId::RandomTruncatedNormal})
    reg(op, kFloatTypes);
  reg(OpId::RandomBernoulli, kAllTypes);
  reg(OpId::RandomDropoutMask, kFloatTypes | DTypeSet{boolean});
  reg(OpId::RandomInteger, kIntTypes);
}

}  // namespace kiln::cuda
