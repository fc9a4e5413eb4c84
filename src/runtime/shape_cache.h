// Dynamic executables: the dims of their inputs (sizes, names, ranges), the checks a feed passes
// before anything runs, and the cache of specializations compiled per set of feed shapes.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kiln/executable.h"
#include "passes/program.h"

namespace kiln {
struct Storage;

namespace detail {
struct ExecutableImpl;
class ArenaPool;

/// The declared dims of a program's placeholders.
class InputDims {
 public:
  /// Reads the placeholders of `p` (in program order), with the sizes their outputs have now.
  explicit InputDims(const Program& p);

  /// Checks feed shapes given when compiling (by placeholder node origin) against sizes, ranges
  /// and shared names, and adds the dims that shared names fix to the placeholders that share
  /// them. Throws ShapeError naming the placeholder, dim and constraint.
  std::vector<std::pair<int32_t, Shape>> complete(
      const std::vector<std::pair<int32_t, Shape>>& shapes) const;
  /// Checks a run's feeds (by program node id; every placeholder fed) before anything runs.
  void check(const std::vector<const Array*>& feed_by_node) const;
  /// Whether some dim has batch buckets (DimSpec::buckets).
  bool has_buckets() const { return !buckets_.empty(); }
  /// The shape each placeholder (by program node id) runs as: its feed's, with every bucketed
  /// dim rounded up to its bucket. For checked feeds.
  std::vector<std::pair<int32_t, Shape>> bucketed(
      const std::vector<const Array*>& feed_by_node) const;

 private:
  struct Dim {
    int64_t size = -1;  // -1: dynamic
    std::string name;
    int64_t min = 0, max = -1;
    const std::vector<int64_t>* buckets = nullptr;  // (in buckets_)
  };
  struct Input {
    int32_t node = -1, origin = -1;
    std::string name;
    std::vector<Dim> dims;
  };
  // The size each dim name took first, and where.
  struct Seen {
    int64_t value;
    const Input* from;
  };
  using Named = std::map<std::string, Seen>;
  // Throws for `value` at dim `d` of input `in` against its size and range.
  void check_dim(const Input& in, size_t d, int64_t value, const char* where) const;
  // The same, and against the size its name took first (recorded in `named`).
  void check_value(const Input& in, size_t d, int64_t value, const char* where, Named& named) const;
  std::vector<Input> inputs_;
  std::map<std::string, std::vector<int64_t>> buckets_;  // by dim name, or "%node.dim" unnamed
};

/// The specializations of a dynamic executable, most recently used first, bounded by count and
/// bytes (CompileOptions::max_specializations / max_specialization_bytes).
class ShapeCache {
 public:
  explicit ShapeCache(const ExecutableImpl& front);

  struct Bound {
    std::shared_ptr<ExecutableImpl> impl;
    std::vector<const Array*> feed_by_node;        // by node id of impl's program
    std::vector<Array> padded;                     // feeds padded to their dims' buckets
    std::vector<std::pair<size_t, int64_t>> cuts;  // outputs to cut to their first rows
    /// The run's outputs with the cuts made (views).
    std::vector<Array> cut(std::vector<Array> outputs) const;
  };
  /// Checks the feeds (by the front's node ids) and returns the specialization for their shapes,
  /// compiling it on a miss, with the feeds bound to its placeholders.
  Bound bind(const ExecutableImpl& front, const std::vector<const Array*>& feed_by_node);
  /// The specialization run last (null before the first run).
  std::shared_ptr<ExecutableImpl> last() const;
  Executable::ShapeCacheStats stats() const;

 private:
  struct Entry {
    std::vector<Shape> key;  // feed shapes, in the front's placeholder order
    std::shared_ptr<ExecutableImpl> impl;
    std::vector<int32_t> front_of_placeholder;  // impl's placeholder ids -> front node ids
    size_t own_bytes = 0;  // arena (on a GPU: the CPU's are the shared pool's) and recordings
    std::vector<std::shared_ptr<Storage>> own_constants;  // constants no front constant holds
  };
  std::shared_ptr<ExecutableImpl> compile(const ExecutableImpl& front,
                                          const std::vector<const Array*>& feed_by_node,
                                          Entry& entry);
  // Gives the constants of a specialization device copies shared with the other
  // specializations: front constants and folded_ values by their host storage, the ones passes
  // made otherwise by content.
  void share_constants(const ExecutableImpl& front, Program& p, Entry& entry);
  // Constant folding for specializations: a node whose inputs are front constants or values
  // folded before (an autocast model's weight casts, say) folds once for all of them.
  std::vector<Array> fold(const ExecutableImpl& front, const Node& n, const std::vector<Array>& in);
  // The outputs a run with bucketed feeds must cut back (Bound::cuts): those whose first dim is a
  // bucketed dim, to its size in `real`. Throws where another dim depends on a padded one.
  std::vector<std::pair<size_t, int64_t>> cuts_locked(const ExecutableImpl& front,
                                                      const std::vector<const Array*>& real,
                                                      const std::vector<const Array*>& padded);
  // The symbolic program of the front, optimized once (template_; null when a dim stays unknown).
  // `seen`: the feed shapes of the miss that builds it (symbolize's min/max choices).
  void build_template(const ExecutableImpl& front,
                      const std::vector<std::pair<int32_t, Shape>>& seen);
  size_t bytes_locked() const;
  void evict_locked();

  InputDims dims_;
  bool template_tried_ = false;
  std::shared_ptr<const Program> template_;
  std::vector<std::pair<int32_t, Shape>> template_inputs_;  // (symbolic_inputs)
  std::string not_symbolic_;                                // why there is no template_
  bool template_fused_ = false;                             // (fuse_for_any_shape)
  int64_t symbolic_misses_ = 0;
  std::shared_ptr<ArenaPool> arenas_;  // the CPU specializations' arenas
  size_t max_count_ = 0, max_bytes_ = 0;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recently used first
  std::map<std::vector<Shape>, std::list<Entry>::iterator> index_;
  std::unordered_map<const void*, std::weak_ptr<Storage>> front_copies_;  // by host address
  std::unordered_map<uint64_t, std::weak_ptr<Storage>> made_by_passes_;
  struct Folded {
    std::vector<Array> inputs;  // kept, so that no other value takes their addresses
    std::vector<Array> outputs;
  };
  std::unordered_map<std::string, Folded> folded_;  // by op, attributes and inputs' addresses
  std::unordered_set<const void*> folded_values_;   // addresses of folded_'s outputs
  std::unordered_set<const void*> front_values_;    // addresses of the front's constants
  int64_t hits_ = 0, misses_ = 0, evictions_ = 0;
  size_t peak_bytes_ = 0;
};

/// A dynamic executable for `p` (extracted, feed shapes applied, some placeholder dynamic).
std::shared_ptr<ExecutableImpl> make_dynamic(Program p, Device device,
                                             const CompileOptions& options,
                                             const GraphImpl* source);

}  // namespace detail
}  // namespace kiln
