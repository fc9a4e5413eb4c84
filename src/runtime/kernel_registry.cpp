#include <algorithm>
#include <array>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <unordered_map>

#include "core/op_id.h"
#include "kiln/kernel.h"
#include "runtime/backends.h"
#include "runtime/thread_pool.h"

namespace kiln {

const char* backend_name(Backend b) { return b == Backend::cpu ? "cpu" : "cuda"; }

namespace {

// Host scratch of the CPU kernels (KernelContext::scratch without a device allocator). Blocks of
// 64 KiB and more are kept for reuse when a kernel is done with them: a freshly mapped block
// costs a page fault, and the zeroing of a page, per page touched at every call. A request takes
// the smallest kept block that fits it and is at most twice its size; at most kKeep bytes are
// kept (the rest is freed).
class HostScratch {
 public:
  static constexpr size_t kMin = size_t{64} << 10, kKeep = size_t{256} << 20;

  void* take(size_t bytes) {
    const size_t want = bytes < kMin ? (std::max<size_t>(bytes, 1) + 255) / 256 * 256
                                     : (bytes + kMin - 1) / kMin * kMin;
    if (want >= kMin) {
      std::lock_guard<std::mutex> l(mu_);
      const auto it = kept_.lower_bound(want);
      if (it != kept_.end() && it->first <= 2 * want) {
        void* p = it->second;
        kept_bytes_ -= it->first;
        kept_.erase(it);
        return p;
      }
    }
    void* p = std::aligned_alloc(256, want);
    if (!p) throw std::bad_alloc();
    if (want >= kMin) {
      std::lock_guard<std::mutex> l(mu_);
      size_of_[p] = want;
    }
    return p;
  }

  void give(void* p) {
    {
      std::lock_guard<std::mutex> l(mu_);
      const auto s = size_of_.find(p);
      if (s != size_of_.end()) {
        if (kept_bytes_ + s->second <= kKeep) {
          kept_.emplace(s->second, p);
          kept_bytes_ += s->second;
          return;
        }
        size_of_.erase(s);
      }
    }
    std::free(p);
  }

 private:
  std::mutex mu_;
  std::multimap<size_t, void*> kept_;         // size -> block
  std::unordered_map<void*, size_t> size_of_;  // every large block handed out or kept
  size_t kept_bytes_ = 0;
};

HostScratch& host_scratch() {
  static auto* s = new HostScratch;  // (never destroyed: kernels may run while the process exits)
  return *s;
}

}  // namespace

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

const KernelChoices& KernelContext::choices() const {
  static const KernelChoices defaults;
  return env_ ? env_->choices : defaults;
}

namespace {
using Table =
    std::array<std::array<std::array<KernelEntry, kOpIdLimit>, kNumLayouts>, kNumBackends>;
Table& table() {
  static Table t{};
  return t;
}
}  // namespace

KernelContext::~KernelContext() {
  for (void* p : scratch_) {
    if (env_ && env_->release) env_->release(env_->user, env_->device, p);
    else host_scratch().give(p);
  }
}

void* KernelContext::scratch(size_t bytes) {
  void* p = nullptr;
  if (env_ && env_->allocate) {
    p = env_->allocate(env_->user, env_->device, bytes, env_->stream);
  } else {
    p = host_scratch().take(bytes);
  }
  scratch_.push_back(p);
  return p;
}

const char* layout_name(Layout l) { return l == Layout::channels_last ? "channels_last" : "plain"; }

void register_kernel(OpId op, Backend backend, KernelEntry entry) {
  register_kernel(op, backend, Layout::plain, entry);
}

void register_kernel(OpId op, Backend backend, Layout layout, KernelEntry entry) {
  table()[static_cast<int>(backend)][static_cast<int>(layout)][static_cast<int>(op)] = entry;
}

const KernelEntry* find_kernel(OpId op, Backend backend, Layout layout) {
  static std::once_flag once;
  std::call_once(once, [] { register_builtin_backends(); });
  const KernelEntry& e =
      table()[static_cast<int>(backend)][static_cast<int>(layout)][static_cast<int>(op)];
  return e.fn ? &e : nullptr;
}

}  // namespace kiln
