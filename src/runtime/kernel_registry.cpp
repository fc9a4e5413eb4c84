#include <algorithm>
#include <array>
#include <cstdlib>
#include <new>
#include <mutex>

#include "core/op_id.h"
#include "kiln/kernel.h"
#include "runtime/backends.h"
#include "runtime/thread_pool.h"

namespace kiln {

const char* backend_name(Backend b) { return b == Backend::cpu ? "cpu" : "cuda"; }

bool KernelEntry::handles(DType t) const {
  if (half_via_f32 && (t == f16 || t == bf16)) return dtypes.has(f32);
  return dtypes.has(t);
}

const char* KernelContext::op_name() const { return kiln::op_name(op_); }

void KernelContext::parallel_for(int64_t n, int64_t grain,
                                 const std::function<void(int64_t, int64_t)>& body) const {
  if (pool_) pool_->parallel_for(n, grain, body);
  else body(0, n);
}

int KernelContext::threads() const { return pool_ ? pool_->size() : 1; }

namespace {
using Table = std::array<std::array<KernelEntry, kOpIdLimit>, kNumBackends>;
Table& table() {
  static Table t{};
  return t;
}
}  // namespace

KernelContext::~KernelContext() {
  for (void* p : scratch_) {
    if (env_ && env_->release) env_->release(env_->device, p);
    else std::free(p);
  }
}

void* KernelContext::scratch(size_t bytes) {
  void* p = nullptr;
  if (env_ && env_->allocate) {
    p = env_->allocate(env_->device, bytes, env_->stream);
  } else {
    p = std::aligned_alloc(256, (std::max<size_t>(bytes, 1) + 255) / 256 * 256);
    if (!p) throw std::bad_alloc();
  }
  scratch_.push_back(p);
  return p;
}

void register_kernel(OpId op, Backend backend, KernelEntry entry) {
  table()[static_cast<int>(backend)][static_cast<int>(op)] = entry;
}

const KernelEntry* find_kernel(OpId op, Backend backend) {
  static std::once_flag once;
  std::call_once(once, [] { register_builtin_backends(); });
  const KernelEntry& e = table()[static_cast<int>(backend)][static_cast<int>(op)];
  return e.fn ? &e : nullptr;
}

}  // namespace kiln
