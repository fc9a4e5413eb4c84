// Dynamic executables: input dims and their checks, and the specialization cache.
#include "runtime/shape_cache.h"

#include <xxhash.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <unordered_set>

#include "core/device_backend.h"
#include "core/dim_specs.h"
#include "core/errors.h"
#include "core/sym_dim.h"
#include "runtime/executable_impl.h"
#include "runtime/profiler.h"
#include "runtime/run_kernel.h"

namespace kiln::detail {

namespace {
std::string range_text(int64_t min, int64_t max) {
  return max < 0 ? fmt::format("at least {}", min) : fmt::format("in [{}, {}]", min, max);
}

std::string shapes_text(const std::vector<Shape>& key) {
  std::string s;
  for (const Shape& k : key) s += (s.empty() ? "" : ", ") + str(k);
  return s;
}

// Bytes of one storage, once however many arrays share it.
size_t distinct_bytes(const std::vector<const std::vector<std::shared_ptr<Storage>>*>& lists) {
  std::unordered_set<const Storage*> seen;
  size_t total = 0;
  for (auto* l : lists)
    for (auto& s : *l)
      if (s && seen.insert(s.get()).second) total += s->bytes;
  return total;
}
}  // namespace

InputDims::InputDims(const Program& p) {
  const auto& nodes = p.graph.nodes;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (n.op != OpId::Placeholder) continue;
    Input in{static_cast<int32_t>(i), n.origin, n.name, {}};
    const Shape& s = n.outputs[0].shape;
    const DimAttrs attrs = dim_attrs(n.attrs, s.size());
    in.dims.resize(s.size());
    for (size_t d = 0; d < s.size(); ++d) {
      in.dims[d] = {s[d], attrs.names[d], attrs.mins[d], attrs.maxs[d]};
      if (attrs.buckets.empty() || attrs.buckets[d].empty()) continue;
      const std::string key = attrs.names[d].empty() ? fmt::format("%{}.{}", i, d) : attrs.names[d];
      auto [it, fresh] = buckets_.try_emplace(key, attrs.buckets[d]);
      if (!fresh && it->second != attrs.buckets[d])
        fail<ShapeError>("[compile] the dims named '{}' have different buckets: ({}) and ({})", key,
                         fmt::join(it->second, ", "), fmt::join(attrs.buckets[d], ", "));
    }
    inputs_.push_back(std::move(in));
  }
  // a dim whose name has buckets pads with them
  for (Input& in : inputs_)
    for (size_t d = 0; d < in.dims.size(); ++d) {
      auto it = buckets_.find(in.dims[d].name.empty() ? fmt::format("%{}.{}", in.node, d)
                                                      : in.dims[d].name);
      if (it != buckets_.end()) in.dims[d].buckets = &it->second;
    }
}

std::vector<std::pair<int32_t, Shape>> InputDims::bucketed(
    const std::vector<const Array*>& feed_by_node) const {
  std::vector<std::pair<int32_t, Shape>> r;
  for (const Input& in : inputs_) {
    Shape s = feed_by_node[in.node]->shape();
    for (size_t d = 0; d < s.size(); ++d)
      if (in.dims[d].buckets) {
        const auto& b = *in.dims[d].buckets;
        auto it = std::lower_bound(b.begin(), b.end(), s[d]);
        if (it != b.end()) s[d] = *it;
      }
    r.emplace_back(in.node, std::move(s));
  }
  return r;
}

void InputDims::check_dim(const Input& in, size_t d, int64_t value, const char* where) const {
  const Dim& dim = in.dims[d];
  const char* what = std::string_view(where) == "run" ? "the feed has" : "the shape given has";
  if (dim.size >= 0 && value != dim.size)
    fail<ShapeError>("[{}] input '{}' dim {} is {} but {} {}", where, in.name, d, dim.size, what,
                     value);
  if (value < dim.min || (dim.max >= 0 && value > dim.max))
    fail<ShapeError>("[{}] input '{}' dim {}{} must be {} but {} {}", where, in.name, d,
                     dim.name.empty() ? "" : " ('" + dim.name + "')", range_text(dim.min, dim.max),
                     what, value);
}

void InputDims::check_value(const Input& in, size_t d, int64_t value, const char* where,
                            Named& named) const {
  check_dim(in, d, value, where);
  const std::string& nm = in.dims[d].name;
  if (nm.empty()) return;
  auto [it, fresh] = named.try_emplace(nm, Seen{value, &in});
  if (!fresh && it->second.value != value)
    fail<ShapeError>("[{}] input '{}' dim {} is '{}' = {} (from '{}') but {} {}", where, in.name, d,
                     nm, it->second.value, it->second.from->name,
                     std::string_view(where) == "run" ? "the feed has" : "the shape given has",
                     value);
}

std::vector<std::pair<int32_t, Shape>> InputDims::complete(
    const std::vector<std::pair<int32_t, Shape>>& shapes) const {
  Named named;
  std::vector<std::pair<int32_t, Shape>> out = shapes;
  for (const Input& in : inputs_)
    for (auto& [origin, shape] : shapes) {
      if (origin != in.origin) continue;
      if (shape.size() != in.dims.size()) continue;  // specialize_shapes reports it
      for (size_t d = 0; d < shape.size(); ++d)
        if (shape[d] >= 0) check_value(in, d, shape[d], "compile", named);
    }
  // a name fixed in one placeholder is fixed in every placeholder that shares it
  for (const Input& in : inputs_) {
    Shape s;
    for (const Dim& d : in.dims) s.push_back(d.size);
    bool changed = false;
    for (auto& [origin, shape] : out)
      if (origin == in.origin && shape.size() == s.size())
        for (size_t d = 0; d < s.size(); ++d) s[d] = shape[d] >= 0 ? shape[d] : s[d];
    for (size_t d = 0; d < s.size(); ++d) {
      auto it = named.find(in.dims[d].name);
      if (s[d] < 0 && !in.dims[d].name.empty() && it != named.end()) {
        s[d] = it->second.value;
        changed = true;
      }
    }
    if (changed) out.emplace_back(in.origin, s);
  }
  return out;
}

void InputDims::check(const std::vector<const Array*>& feed_by_node) const {
  Named named;
  for (const Input& in : inputs_) {
    const Array* a = feed_by_node[in.node];
    if (!a) fail<ValueError>("[run] placeholder '{}' has no feed", in.name);
    const Shape& s = a->shape();
    if (s.size() != in.dims.size())
      fail<ShapeError>("[run] input '{}' has {} dims but the feed has shape {}", in.name,
                       in.dims.size(), str(s));
    for (size_t d = 0; d < s.size(); ++d) check_value(in, d, s[d], "run", named);
  }
}

ShapeCache::ShapeCache(const ExecutableImpl& front)
    : dims_(front.program),
      arenas_(std::make_shared<ArenaPool>()),
      max_count_(front.options.max_specializations),
      max_bytes_(front.options.max_specialization_bytes) {}

ShapeCache::Bound ShapeCache::bind(const ExecutableImpl& front,
                                   const std::vector<const Array*>& feed_by_node) {
  dims_.check(feed_by_node);
  std::vector<const Array*> feeds = feed_by_node;
  std::vector<Array> padded;
  if (dims_.has_buckets()) {
    auto shapes = dims_.bucketed(feed_by_node);
    padded.reserve(shapes.size());  // (feeds point into it)
    for (auto& [node, s] : shapes)
      if (s != feed_by_node[node]->shape()) {
        padded.push_back(feed_by_node[node]->padded(s));
        feeds[node] = &padded.back();
      }
  }
  std::vector<Shape> key;
  key.reserve(front.placeholders.size());
  for (int32_t ph : front.placeholders) key.push_back(feeds[ph]->shape());
  std::lock_guard<std::mutex> l(mu_);
  auto it = index_.find(key);
  if (it != index_.end()) {
    ++hits_;
    lru_.splice(lru_.begin(), lru_, it->second);
  } else {
    ++misses_;
    Entry e;
    e.key = key;
    e.impl = compile(front, feeds, e);
    lru_.push_front(std::move(e));
    index_[key] = lru_.begin();
    evict_locked();
  }
  const Entry& e = lru_.front();
  Bound b{e.impl, std::vector<const Array*>(e.impl->program.graph.nodes.size(), nullptr)};
  for (int32_t ph : e.impl->placeholders) b.feed_by_node[ph] = feeds[e.front_of_placeholder[ph]];
  if (!padded.empty()) b.cuts = cuts_locked(front, feed_by_node, feeds);
  b.padded = std::move(padded);  // (the vector's elements keep their addresses)
  return b;
}

std::vector<Array> ShapeCache::Bound::cut(std::vector<Array> outputs) const {
  for (auto [k, rows] : cuts) outputs[k] = outputs[k].first_rows(rows);
  return outputs;
}

std::vector<std::pair<size_t, int64_t>> ShapeCache::cuts_locked(
    const ExecutableImpl& front, const std::vector<const Array*>& real,
    const std::vector<const Array*>& padded) {
  if (!template_tried_) {
    std::vector<std::pair<int32_t, Shape>> seen;
    for (int32_t ph : front.placeholders) seen.emplace_back(ph, padded[ph]->shape());
    build_template(front, seen);
  }
  if (!template_)
    fail<UnsupportedError>(
        "[run] dim buckets need every dim of the program known as an expression of the "
        "inputs' dims, and {}",
        not_symbolic_);
  // each placeholder dim's symbol: its size in the feeds and in the padded feeds
  std::map<std::string, int64_t> real_size, padded_size;
  std::set<int64_t> grown;
  for (const auto& [origin, s] : template_inputs_)
    for (size_t d = 0; d < s.size(); ++d) {
      if (!sym::is_symbolic(s[d])) continue;
      real_size[sym::str(s[d])] = real[origin]->shape()[d];
      padded_size[sym::str(s[d])] = padded[origin]->shape()[d];
      if (real[origin]->shape()[d] != padded[origin]->shape()[d]) grown.insert(s[d]);
    }
  auto in = [](const std::map<std::string, int64_t>& m) {
    return [&m](const std::string& name) {
      auto it = m.find(name);
      return it == m.end() ? kDynamic : it->second;
    };
  };
  std::vector<std::pair<size_t, int64_t>> cuts;
  for (size_t k = 0; k < template_->num_returned; ++k) {
    const Shape& s = template_->graph.info(template_->outputs[k]).shape;
    for (size_t d = 0; d < s.size(); ++d) {
      const int64_t want = sym::evaluate(s[d], in(real_size));
      if (want == sym::evaluate(s[d], in(padded_size))) continue;
      if (d != 0 || !grown.count(s[d]))
        fail<UnsupportedError>(
            "[run] output {} has shape {}: its dim {} depends on a padded "
            "bucketed dim, and only a first dim that is one can be cut back",
            k, sym::str(s), d);
      cuts.emplace_back(k, want);
    }
  }
  return cuts;
}

std::shared_ptr<ExecutableImpl> ShapeCache::compile(const ExecutableImpl& front,
                                                    const std::vector<const Array*>& feed_by_node,
                                                    Entry& e) {
  prof::HostScope span(SpanKind::compile, "specialize",
                       prof::on() ? "for shapes " + shapes_text(e.key) : "");
  if (front_values_.empty())
    for (const Node& n : front.program.graph.nodes)
      if (n.op == OpId::Constant && n.value.storage()) front_values_.insert(n.value.data());
  std::vector<std::pair<int32_t, Shape>> shapes;
  for (int32_t ph : front.placeholders) shapes.emplace_back(ph, feed_by_node[ph]->shape());
  const NodeEvaluator folder = [&](const Node& n, const std::vector<Array>& in) {
    return fold(front, n, in);
  };
  const auto share = [&](Program& q) { share_constants(front, q, e); };
  if (!template_tried_) build_template(front, shapes);
  std::shared_ptr<ExecutableImpl> impl;
  if (template_) {
    try {
      Program q;
      {
        prof::HostScope phase(SpanKind::compile, "instantiate");
        q = instantiate(*template_, template_inputs_, shapes, &folder);
      }
      impl = compile_optimized(std::move(q), front.device, front.options, share,
                               /*many_shapes=*/true, template_fused_);
      ++symbolic_misses_;
    } catch (const Error&) {
      impl = nullptr;  // (the passes run again for these shapes, and report what is wrong)
    }
  }
  if (!impl) {
    Program p = front.program;  // constants and variables share their data
    for (size_t i = 0; i < p.graph.nodes.size(); ++i)
      p.graph.nodes[i].origin = static_cast<int32_t>(i);
    impl = compile_program(std::move(p), front.device, front.options, shapes, share, folder);
  }
  impl->source = nullptr;  // fed through the front
  impl->many_shapes = true;
  const auto& nodes = impl->program.graph.nodes;
  e.front_of_placeholder.assign(nodes.size(), -1);
  for (int32_t ph : impl->placeholders) e.front_of_placeholder[ph] = nodes[ph].origin;
  if (impl->backend) {
    e.own_bytes = impl->plan.arena_bytes;
  } else {
    impl->arenas = arenas_;  // a new shape reuses the arenas earlier shapes made
  }
  // a recorded run keeps buffers of its own for the feeds and the returned values
  if (impl->backend && impl->options.capture) {
    for (int32_t ph : impl->placeholders) e.own_bytes += feed_by_node[nodes[ph].origin]->nbytes();
    for (size_t k = 0; k < impl->program.num_returned; ++k) {
      const TensorInfo& t = impl->program.graph.info(impl->program.outputs[k]);
      e.own_bytes += static_cast<size_t>(numel(t.shape)) * size_of(t.dtype);
    }
  }
  return impl;
}

void ShapeCache::build_template(const ExecutableImpl& front,
                                const std::vector<std::pair<int32_t, Shape>>& seen) {
  template_tried_ = true;
  prof::HostScope span(SpanKind::compile, "symbolic program");
  Program p = front.program;
  for (size_t i = 0; i < p.graph.nodes.size(); ++i)
    p.graph.nodes[i].origin = static_cast<int32_t>(i);
  try {
    symbolize(p, &seen);
    template_inputs_ = symbolic_inputs(p);
    not_symbolic_ = first_unknown_dim(p);
    if (!not_symbolic_.empty()) return;
    optimize_for_any_shape(p, front.options, evaluate_node_cpu);
  } catch (const Error& e) {
    not_symbolic_ = e.what();  // (each shape runs the passes, which report what is wrong for it)
    return;
  }
  try {
    template_fused_ = fuse_for_any_shape(p, front.options, front.device);
  } catch (const Error&) {
    template_fused_ = false;  // (each shape fuses its chains, and reports what is wrong)
  }
  not_symbolic_ = first_unknown_dim(p);
  if (!not_symbolic_.empty()) return;
  // what folding made is shared by address, like folded_ values
  for (const Node& n : p.graph.nodes)
    if (n.op == OpId::Constant && n.value.storage() && !front_values_.count(n.value.data()))
      folded_values_.insert(n.value.data());
  template_ = std::make_shared<const Program>(std::move(p));
}

std::vector<Array> ShapeCache::fold(const ExecutableImpl& front, const Node& n,
                                    const std::vector<Array>& in) {
  bool shared = !in.empty();
  std::string key = fmt::format("{}|{}", static_cast<int>(n.op), n.attrs.to_string());
  for (const Array& a : in) {
    shared =
        shared && a.storage() && (front_values_.count(a.data()) || folded_values_.count(a.data()));
    key += fmt::format("|{}:{}:{}", a.data(), str(a.shape()), name(a.dtype()));
  }
  if (!shared) return evaluate_node_cpu(n, in);  // (it depends on this specialization's shapes)
  auto it = folded_.find(key);
  if (it != folded_.end()) return it->second.outputs;
  std::vector<Array> out = evaluate_node_cpu(n, in);
  for (const Array& a : out)
    if (a.storage()) folded_values_.insert(a.data());
  folded_[key] = {in, out};
  return out;
}

void ShapeCache::share_constants(const ExecutableImpl& front, Program& p, Entry& e) {
  const Device device = front.device;
  const bool on_host = device.kind == Device::Kind::cpu;
  for (Node& n : p.graph.nodes) {
    if (n.op != OpId::Constant) continue;
    Array& v = n.value;
    const auto& st = v.storage();
    if (!st || st->device.kind != Device::Kind::cpu) continue;
    const bool front_constant = front_values_.count(v.data()) > 0;
    const bool folded_once = folded_values_.count(v.data()) > 0;  // (counted, shared by address)
    // on the host, the front's constants are shared as they are, and views keep their handle
    const bool whole = v.data() == st->data && v.nbytes() == st->bytes;
    if (on_host && (front_constant || !whole)) continue;
    std::weak_ptr<Storage>* slot = nullptr;
    if (front_constant || folded_once) {
      slot = &front_copies_[v.data()];
    } else {
      XXH3_state_t* h = XXH3_createState();
      XXH3_64bits_reset(h);
      const auto dt = static_cast<int32_t>(v.dtype());
      XXH3_64bits_update(h, &dt, sizeof dt);
      XXH3_64bits_update(h, v.shape().data(), v.shape().size() * sizeof(int64_t));
      XXH3_64bits_update(h, v.data(), v.nbytes());
      const uint64_t digest = XXH3_64bits_digest(h);
      XXH3_freeState(h);
      slot = &made_by_passes_[digest];
    }
    std::shared_ptr<Storage> shared = slot->lock();
    if (!shared || shared->bytes < v.nbytes()) {
      shared =
          v.to(device).storage();  // (a copy of its own on a GPU; on the host, v's whole storage)
      *slot = shared;
    }
    n.value = Array::adopt(shared, v.shape(), v.dtype());
    if (!front_constant) e.own_constants.push_back(shared);
  }
}

size_t ShapeCache::bytes_locked() const {
  size_t total = 0;
  std::vector<const std::vector<std::shared_ptr<Storage>>*> lists;
  for (const Entry& e : lru_) {
    total += e.own_bytes;
    lists.push_back(&e.own_constants);
  }
  return total + distinct_bytes(lists) + arenas_->bytes();
}

void ShapeCache::evict_locked() {
  auto over = [&] {
    return (max_count_ && lru_.size() > max_count_) || (max_bytes_ && bytes_locked() > max_bytes_);
  };
  while (lru_.size() > 1 && over()) {
    index_.erase(lru_.back().key);
    lru_.pop_back();
    ++evictions_;
  }
  for (auto it = made_by_passes_.begin(); it != made_by_passes_.end();)
    it = it->second.expired() ? made_by_passes_.erase(it) : std::next(it);
  for (auto it = front_copies_.begin(); it != front_copies_.end();)
    it = it->second.expired() ? front_copies_.erase(it) : std::next(it);
  peak_bytes_ = std::max(peak_bytes_, bytes_locked());
}

std::shared_ptr<ExecutableImpl> ShapeCache::last() const {
  std::lock_guard<std::mutex> l(mu_);
  return lru_.empty() ? nullptr : lru_.front().impl;
}

Executable::ShapeCacheStats ShapeCache::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  Executable::ShapeCacheStats s;
  s.hits = hits_;
  s.misses = misses_;
  s.evictions = evictions_;
  s.entries = lru_.size();
  s.bytes = bytes_locked();
  s.peak_bytes = peak_bytes_;
  s.max_entries = max_count_;
  s.max_bytes = max_bytes_;
  s.symbolic = template_ != nullptr;
  s.not_symbolic = not_symbolic_;
  s.symbolic_misses = symbolic_misses_;
  return s;
}

std::shared_ptr<ExecutableImpl> make_dynamic(Program p, Device device,
                                             const CompileOptions& options,
                                             const GraphImpl* source) {
  auto impl = std::make_shared<ExecutableImpl>();
  impl->device = device;
  impl->source = source;
  impl->options = options;
  impl->backend = backend_of(device);
  for (size_t i = 0; i < p.graph.nodes.size(); ++i) {
    const OpId op = p.graph.nodes[i].op;
    if (op == OpId::Placeholder) impl->placeholders.push_back(static_cast<int32_t>(i));
    else if (op == OpId::Variable) impl->variables.push_back(static_cast<int32_t>(i));
  }
  impl->program = std::move(p);
  impl->dynamic = std::make_shared<ShapeCache>(*impl);
  return impl;
}

}  // namespace kiln::detail
