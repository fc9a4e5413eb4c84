#include "backends/cpu/layout.h"

#include "core/errors.h"
#include "runtime/thread_pool.h"

namespace kiln::cpu {

namespace {

// permute4 for elements of `bytes` bytes.
void permute4_bytes(const KernelContext& ctx, const void* src, const Shape& s, void* dst,
                    const std::array<int, 4>& perm, size_t bytes) {
  switch (bytes) {
    case 1:
      return permute4(ctx, static_cast<const uint8_t*>(src), s, static_cast<uint8_t*>(dst), perm);
    case 2:
      return permute4(ctx, static_cast<const uint16_t*>(src), s, static_cast<uint16_t*>(dst),
                      perm);
    case 4:
      return permute4(ctx, static_cast<const uint32_t*>(src), s, static_cast<uint32_t*>(dst),
                      perm);
    case 8:
      return permute4(ctx, static_cast<const uint64_t*>(src), s, static_cast<uint64_t*>(dst),
                      perm);
    default:
      fail<UnsupportedError>("[{}] channels_last copies of {}-byte elements", ctx.op_name(),
                             bytes);
  }
}

}  // namespace

void run_via_nchw(KernelContext& ctx, KernelFn kernel) {
  const TensorView& x = ctx.in(0);
  if (x.shape.size() != 4)
    fail<ValueError>("[{}] channels_last takes 4-D inputs, got shape {}", ctx.op_name(),
                     str(x.shape));
  auto scratch = [&](const Shape& s, DType t) {
    return TensorView{ctx.scratch(static_cast<size_t>(numel(s)) * size_of(t)), s, t};
  };
  std::vector<TensorView> in;
  for (int k = 0; k < ctx.num_inputs(); ++k) {
    const TensorView& v = ctx.in(k);
    if (v.shape.size() != 4) {
      in.push_back(v);
      continue;
    }
    in.push_back(scratch(nchw_of(v.shape), v.dtype));
    permute4_bytes(ctx, v.data, v.shape, in.back().data, kNhwcToNchw, size_of(v.dtype));
  }
  std::vector<TensorView> out;
  for (int k = 0; k < ctx.num_outputs(); ++k) {
    const TensorView& y = ctx.out(k);
    out.push_back(y.shape.size() == 4 ? scratch(nchw_of(y.shape), y.dtype) : y);
  }
  Attrs attrs = ctx.attrs();
  attrs.set("channels_last", false);
  {
    KernelContext inner(ctx.op(), attrs, in, out, &ThreadPool::global());
    kernel(inner);
  }
  for (int k = 0; k < ctx.num_outputs(); ++k)
    if (ctx.out(k).shape.size() == 4)
      permute4_bytes(ctx, out[k].data, out[k].shape, ctx.out(k).data, kNchwToNhwc,
                     size_of(out[k].dtype));
}

}  // namespace kiln::cpu
