#include "backends/cpu/cpu_common.h"

#include <cstdlib>
#include <string_view>

#include "backends/cpu/dnnl_util.h"
#include "runtime/env.h"

namespace kiln::cpu {

AxisSplit split_at(const Shape& s, int64_t axis) {
  AxisSplit r;
  for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) {
    if (d < axis) r.outer *= s[d];
    else if (d == axis) r.len = s[d];
    else r.inner *= s[d];
  }
  return r;
}

std::vector<int64_t> broadcast_strides(const Shape& in, const Shape& out) {
  std::vector<int64_t> s;
  broadcast_strides(in, out, s);
  return s;
}

void broadcast_strides(const Shape& in, const Shape& out, std::vector<int64_t>& s) {
  s.assign(out.size(), 0);
  const size_t off = out.size() - in.size();
  int64_t step = 1;  // in's contiguous stride at i
  for (size_t i = in.size(); i-- > 0;) {
    s[off + i] = in[i] == 1 ? 0 : step;
    step *= std::max<int64_t>(in[i], 1);  // (as contiguous_strides)
  }
}

template <int N>
void plan_broadcast(const Shape& out, const std::array<const Shape*, N>& ins, BroadcastPlan<N>& p) {
  // each input's stride per output dim (0 where it broadcasts), in this thread's memory
  thread_local std::array<std::vector<int64_t>, N> strides;
  const size_t R = out.size();
  for (int k = 0; k < N; ++k) broadcast_strides(*ins[k], out, strides[k]);
  auto st = [&](int k, size_t d) { return strides[k][d]; };
  p.shape.clear();
  for (int k = 0; k < N; ++k) p.strides[k].clear();
  // drop size-1 dims, then merge dim d into d+1 when every input is contiguous across them
  for (size_t d = 0; d < R; ++d) {
    if (out[d] == 1) continue;
    if (!p.shape.empty()) {
      bool merge = true;
      for (int k = 0; k < N && merge; ++k) merge = p.strides[k].back() == st(k, d) * out[d];
      if (merge) {
        p.shape.back() *= out[d];
        for (int k = 0; k < N; ++k) p.strides[k].back() = st(k, d);
        continue;
      }
    }
    p.shape.push_back(out[d]);
    for (int k = 0; k < N; ++k) p.strides[k].push_back(st(k, d));
  }
  if (p.shape.empty()) {
    p.shape.push_back(1);
    for (int k = 0; k < N; ++k) p.strides[k].push_back(0);
  }
}

template void plan_broadcast<1>(const Shape&, const std::array<const Shape*, 1>&,
                                BroadcastPlan<1>&);
template void plan_broadcast<2>(const Shape&, const std::array<const Shape*, 2>&,
                                BroadcastPlan<2>&);
template void plan_broadcast<3>(const Shape&, const std::array<const Shape*, 3>&,
                                BroadcastPlan<3>&);

CpuIsa cpu_isa() {
  static const CpuIsa isa = [] {
#if defined(__x86_64__) && defined(__GNUC__)
    const char* cap = env::get(env::Var::KILN_CPU_ISA);
    const std::string_view want = cap ? cap : "";
    __builtin_cpu_init();
    if (want != "baseline" && want != "avx2" && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
      return CpuIsa::avx512;
    if (want != "baseline" && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
      return CpuIsa::avx2;
#endif
    return CpuIsa::baseline;
  }();
  return isa;
}

bool native_bf16() {
  return cpu_isa() == CpuIsa::avx512 && dnnl_util::native_bf16_matmul();
}

}  // namespace kiln::cpu
