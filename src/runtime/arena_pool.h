// The host arenas of CPU runs: each run takes one (concurrent runs take one each) and gives it
// back. A static executable has a pool of its own; the specializations of a dynamic executable
// share one, so that a new shape reuses an arena earlier shapes made (a fresh one costs its page
// faults: about 0.1 s for a 4-layer encoder's 40 MB on the first run of each shape).
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace kiln {
struct Storage;

namespace detail {

class ArenaPool {
 public:
  /// An arena of at least `bytes` (null for 0): the smallest free one that is large enough, else
  /// a new one (which replaces the largest free one, too small).
  std::shared_ptr<Storage> take(size_t bytes);
  /// Returns an arena from take() for later runs.
  void give(std::shared_ptr<Storage> arena);
  /// Bytes of the arenas made and not dropped (free or in a run).
  size_t bytes() const;

  /// An arena taken for a scope and given back when it ends (a run that throws included).
  struct Lease {
    Lease(ArenaPool& pool, size_t bytes) : pool(pool), arena(pool.take(bytes)) {}
    ~Lease() { pool.give(std::move(arena)); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ArenaPool& pool;
    std::shared_ptr<Storage> arena;
  };

 private:
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<Storage>> free_;
  size_t bytes_ = 0;
};

}  // namespace detail
}  // namespace kiln
