#include "runtime/arena_pool.h"

#include <algorithm>

#include "kiln/array.h"

namespace kiln::detail {

std::shared_ptr<Storage> ArenaPool::take(size_t bytes) {
  if (!bytes) return nullptr;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto by_size = [](const auto& a, const auto& b) { return a->bytes < b->bytes; };
    std::sort(free_.begin(), free_.end(), by_size);
    auto fit =
        std::find_if(free_.begin(), free_.end(), [&](const auto& a) { return a->bytes >= bytes; });
    if (fit != free_.end()) {
      auto a = std::move(*fit);
      free_.erase(fit);
      return a;
    }
    if (!free_.empty()) {  // the largest is too small: the new arena takes its place
      bytes_ -= free_.back()->bytes;
      free_.pop_back();
    }
  }
  auto a = Array::empty({static_cast<int64_t>(bytes)}, u8).storage();
  std::lock_guard<std::mutex> l(mu_);
  bytes_ += a->bytes;
  return a;
}

void ArenaPool::give(std::shared_ptr<Storage> arena) {
  if (!arena) return;
  std::lock_guard<std::mutex> l(mu_);
  free_.push_back(std::move(arena));
}

size_t ArenaPool::bytes() const {
  std::lock_guard<std::mutex> l(mu_);
  return bytes_;
}

}  // namespace kiln::detail
