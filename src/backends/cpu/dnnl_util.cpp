#include "backends/cpu/dnnl_util.h"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string_view>
#include <unordered_map>

#include "core/errors.h"
#include "runtime/env.h"

namespace kiln::cpu::dnnl_util {

namespace {
using dt = dnnl::memory::data_type;

struct KeyHash {
  size_t operator()(const Dims& k) const {
    size_t h = k.size();
    for (int64_t v : k) h ^= std::hash<int64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
  }
};

// Enough for the distinct shapes of a few models; on overflow start over (entries in use stay
// alive through their shared_ptr).
constexpr size_t kMaxCached = 512;

struct Cache {
  std::mutex mu;
  std::unordered_map<Dims, std::shared_ptr<const CachedPrimitive>, KeyHash> map;
};
Cache& cache() {
  static Cache c;
  return c;
}

// Room for reordered arguments, kept per thread between calls: touching fresh pages costs as
// much as the reorder itself. It grows to the largest call the thread has run.
char* thread_scratch(size_t bytes) {
  thread_local std::unique_ptr<char, decltype(&std::free)> buf{nullptr, &std::free};
  thread_local size_t capacity = 0;
  if (bytes > capacity) {
    buf.reset(static_cast<char*>(std::aligned_alloc(64, bytes)));
    if (!buf) throw std::bad_alloc();
    capacity = bytes;
  }
  return buf.get();
}

size_t round_up(size_t n) { return (n + 63) / 64 * 64; }

// One call's memory objects: per argument, kiln's buffer in its own layout (user) and, where
// the primitive wants another, the primitive's copy (inner: in scratch, or the caller's buffer
// already in that layout) and an output's starting value (start); and the primitive's arguments
// for the C API (which, unlike the C++ one, builds no list per call).
struct Binding {
  std::vector<dnnl::memory> user, inner, start;
  dnnl::memory pad;
  std::vector<dnnl_exec_arg_t> exec;
};

void check(dnnl_status_t status, const char* what) { dnnl::error::wrap_c_api(status, what); }

void run_reorder(const dnnl::reorder& r, const dnnl::stream& s, const dnnl::memory& from,
                 const dnnl::memory& to) {
  const dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from.get()}, {DNNL_ARG_TO, to.get()}};
  check(dnnl_primitive_execute(r.get(), s.get(), 2, args), "could not execute a reorder");
}

std::unique_ptr<Binding> make_binding(const CachedPrimitive& p) {
  auto b = std::make_unique<Binding>();
  const size_t n = p.args.size();
  b->user.resize(n);
  b->inner.resize(n);
  b->start.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const Arg& a = p.args[i];
    b->user[i] = dnnl::memory(a.user, engine(), DNNL_MEMORY_NONE);
    if (a.reorder) b->inner[i] = dnnl::memory(a.chosen, engine(), DNNL_MEMORY_NONE);
    if (a.reorder_in) b->start[i] = dnnl::memory(a.user, engine(), DNNL_MEMORY_NONE);
    b->exec.push_back({a.id, (a.reorder ? b->inner[i] : b->user[i]).get()});
  }
  if (p.scratchpad.get_size()) {
    b->pad = dnnl::memory(p.scratchpad, engine(), DNNL_MEMORY_NONE);
    b->exec.push_back({DNNL_ARG_SCRATCHPAD, b->pad.get()});
  }
  return b;
}
}  // namespace

struct Bindings {
  std::mutex mu;
  std::vector<std::unique_ptr<Binding>> idle;
};

std::shared_ptr<Bindings> new_bindings() { return std::make_shared<Bindings>(); }

namespace {
void run(const CachedPrimitive& p, const std::vector<void*>& buffers, const void* dst_init,
         int chosen_arg) {
  size_t scratch_bytes = 0;
  for (size_t i = 0; i < p.args.size(); ++i)
    if (p.args[i].reorder && static_cast<int>(i) != chosen_arg)
      scratch_bytes += round_up(p.args[i].chosen.get_size());
  const size_t pad_bytes = round_up(p.scratchpad.get_size());
  scratch_bytes += pad_bytes;
  char* scratch = scratch_bytes ? thread_scratch(scratch_bytes) : nullptr;

  std::unique_ptr<Binding> b;
  {
    std::lock_guard<std::mutex> l(p.bindings->mu);
    if (!p.bindings->idle.empty()) {
      b = std::move(p.bindings->idle.back());
      p.bindings->idle.pop_back();
    }
  }
  if (!b) b = make_binding(p);
  thread_local const dnnl::stream s(engine());
  if (pad_bytes) {
    b->pad.set_data_handle(scratch);
    scratch += pad_bytes;
  }
  for (size_t i = 0; i < p.args.size(); ++i) {
    const Arg& a = p.args[i];
    if (static_cast<int>(i) == chosen_arg && a.reorder) {
      b->inner[i].set_data_handle(buffers[i]);
      continue;
    }
    const dnnl::memory& user = b->user[i];
    user.set_data_handle(buffers[i]);
    const bool init = a.output && dst_init;
    if (!a.reorder) {
      if (init && dst_init != buffers[i]) std::memcpy(buffers[i], dst_init, a.user.get_size());
      continue;
    }
    const dnnl::memory& inner = b->inner[i];
    inner.set_data_handle(scratch);
    scratch += round_up(a.chosen.get_size());
    if (init) {
      b->start[i].set_data_handle(const_cast<void*>(dst_init));
      run_reorder(*a.reorder_in, s, b->start[i], inner);
    }
    if (!a.output) run_reorder(*a.reorder, s, user, inner);
  }
  check(dnnl_primitive_execute(p.prim.get(), s.get(), static_cast<int>(b->exec.size()),
                               b->exec.data()),
        "could not execute a primitive");
  for (size_t i = 0; i < p.args.size(); ++i)
    if (p.args[i].output && p.args[i].reorder)
      run_reorder(*p.args[i].reorder, s, b->inner[i], b->user[i]);
  check(dnnl_stream_wait(s.get()), "could not wait for a stream");
  std::lock_guard<std::mutex> l(p.bindings->mu);
  p.bindings->idle.push_back(std::move(b));
}
}  // namespace

const dnnl::primitive_attr& attr() {
  static const dnnl::primitive_attr a = [] {
    dnnl::primitive_attr r;
    r.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return r;
  }();
  return a;
}

const dnnl::engine& engine() {
  static const dnnl::engine e = [] {
    // KILN_CPU_ISA caps oneDNN's kernels as it caps kiln's own (cpu_common.h), before oneDNN
    // first looks at the CPU: one machine then repeats another's CPU arithmetic (the same
    // kernels, so the same order of adding for the same thread count)
    const char* cap = env::get(env::Var::KILN_CPU_ISA);
    const std::string_view want = cap ? cap : "";
    if (want == "baseline" || want == "avx2" || want == "avx512")
      dnnl::set_max_cpu_isa(want == "baseline" ? dnnl::cpu_isa::sse41
                            : want == "avx2"   ? dnnl::cpu_isa::avx2
                                               : dnnl::cpu_isa::avx512_core);
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return e;
}

dnnl::memory::desc plain_md(const Dims& dims, dt t) {
  Dims strides(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i)
    strides[i] = strides[i + 1] * std::max<int64_t>(dims[i + 1], 1);
  return strided_md(dims, strides, t);
}

dnnl::memory::desc strided_md(const Dims& dims, const Dims& strides, dt t) {
  return dnnl::memory::desc(dims, t, strides);
}

dt data_type(DType t) { return t == DType::bf16 ? dt::bf16 : dt::f32; }

bool native_bf16_matmul() {
  static const bool native = [] {
    try {
      const auto md = plain_md({64, 64}, dt::bf16);
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(md, md, md), attr(), engine());
      const char* impl = pd.impl_info_str();
      return impl != nullptr && std::strncmp(impl, "ref", 3) != 0;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return native;
}

dnnl::memory::desc any_md(const Dims& dims) {
  return dnnl::memory::desc(dims, dt::f32, dnnl::memory::format_tag::any);
}

Arg make_arg(int id, const dnnl::memory::desc& user, const dnnl::memory::desc& chosen, bool output,
             bool accumulates) {
  Arg a{id, user, chosen, output, std::nullopt, std::nullopt};
  if (user == chosen) return a;
  auto reorder = [](const dnnl::memory::desc& from, const dnnl::memory::desc& to) {
    return dnnl::reorder(dnnl::reorder::primitive_desc(engine(), from, engine(), to));
  };
  a.reorder = output ? reorder(chosen, user) : reorder(user, chosen);
  if (output && accumulates) a.reorder_in = reorder(user, chosen);
  return a;
}

std::shared_ptr<const CachedPrimitive> cached(const char* op, const Dims& key,
                                              const std::function<CachedPrimitive()>& make) {
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> l(c.mu);
    auto it = c.map.find(key);
    if (it != c.map.end()) return it->second;
  }
  // made outside the lock: two threads may both make it, and one copy wins
  std::shared_ptr<const CachedPrimitive> p;
  try {
    p = std::make_shared<const CachedPrimitive>(make());
  } catch (const dnnl::error& e) {
    fail<UnsupportedError>("[{}] oneDNN could not create a primitive: {}", op, e.what());
  }
  std::lock_guard<std::mutex> l(c.mu);
  if (c.map.size() >= kMaxCached) c.map.clear();
  return c.map.emplace(key, std::move(p)).first->second;
}

std::shared_ptr<void> reordered(const char* op, const Arg& a, const void* data) {
  const size_t bytes = round_up(std::max<size_t>(a.chosen.get_size(), 1));
  std::shared_ptr<void> out(std::aligned_alloc(64, bytes), &std::free);
  if (!out) throw std::bad_alloc();
  try {
    dnnl::stream s(engine());
    dnnl::memory from(a.user, engine(), const_cast<void*>(data)), to(a.chosen, engine(), out.get());
    a.reorder->execute(s, from, to);  // (an input's: user to chosen)
    s.wait();
  } catch (const dnnl::error& e) {
    fail<UnsupportedError>("[{}] oneDNN failed: {}", op, e.what());
  }
  return out;
}

namespace {
// A constant weight in the layout its primitive chose (KernelState::value).
struct PackedWeight {
  dnnl::memory::desc user, layout;  // the weight's own layout and the one it was laid out in
  std::shared_ptr<void> data;
};

// The weights laid out so far, by the address of the weight they came from, while some node
// holds them: the specializations of a dynamic executable (each with its own nodes, one per
// shape) share one laid-out copy of each constant instead of making one per shape. An entry
// counts only while a node keeps it alive, and a node lives as long as the constant it reads, so
// a live entry's address is that constant's.
class SharedWeights {
 public:
  std::shared_ptr<const PackedWeight> find(const void* data, const Arg& a) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = by_data_.find(data);
    if (it == by_data_.end()) return nullptr;
    for (const auto& w : it->second)
      if (auto p = w.lock(); p && p->user == a.user && p->layout == a.chosen) return p;
    return nullptr;
  }
  void add(const void* data, const std::shared_ptr<const PackedWeight>& p) {
    std::lock_guard<std::mutex> l(mu_);
    for (auto it = by_data_.begin(); it != by_data_.end();) {  // (entries no node holds)
      auto& v = it->second;
      v.erase(std::remove_if(v.begin(), v.end(), [](const auto& w) { return w.expired(); }),
              v.end());
      it = v.empty() ? by_data_.erase(it) : std::next(it);
    }
    by_data_[data].push_back(p);
  }

 private:
  std::mutex mu_;
  std::unordered_map<const void*, std::vector<std::weak_ptr<const PackedWeight>>> by_data_;
};

std::atomic<size_t> laid_out{0};

SharedWeights& shared_weights() {
  static auto* s = new SharedWeights;  // (never destroyed: kernels may run while the process exits)
  return *s;
}
}  // namespace

std::shared_ptr<const void> packed_weight(const char* op, const Arg& a, const void* data,
                                          KernelState& state) {
  std::lock_guard<std::mutex> lock(state.mu);
  auto held = std::static_pointer_cast<const PackedWeight>(state.value);
  if (state.key != data || !held || held->user != a.user || held->layout != a.chosen) {
    held = shared_weights().find(data, a);
    const uint64_t key = layout_key(a);
    const size_t size = a.chosen.get_size();
    if (!held && state.stored && state.stored_layout == key && state.stored_size == size) {
      // a package's copy, laid out by this library on this instruction set (its reader checked
      // both): its bytes stay where the file was read
      held = std::make_shared<const PackedWeight>(
          PackedWeight{a.user, a.chosen,
                       std::shared_ptr<void>(state.stored, const_cast<void*>(state.stored.get()))});
      shared_weights().add(data, held);
    } else if (!held) {
      held = std::make_shared<const PackedWeight>(
          PackedWeight{a.user, a.chosen, reordered(op, a, data)});
      shared_weights().add(data, held);
      laid_out.fetch_add(1, std::memory_order_relaxed);
    }
    state.value = held;
    state.key = data;
    state.layout = key;
    state.bytes = held->data.get();
    state.size = size;
  }
  return {held, held->data.get()};
}

uint64_t layout_key(const Arg& a) {
  std::vector<int64_t> v;
  for (const dnnl::memory::desc* md : {&a.user, &a.chosen}) {
    const dnnl_memory_desc_t& d = md->data;
    const int nd = std::clamp(d.ndims, 0, DNNL_MAX_NDIMS);
    v.push_back(nd);
    v.push_back(d.data_type);
    v.push_back(d.format_kind);
    v.push_back(d.offset0);
    for (int i = 0; i < nd; ++i)
      v.insert(v.end(), {d.dims[i], d.padded_dims[i], d.padded_offsets[i]});
    if (d.format_kind == dnnl_blocked) {
      const dnnl_blocking_desc_t& b = d.format_desc.blocking;
      v.insert(v.end(), b.strides, b.strides + nd);
      const int nb = std::clamp(b.inner_nblks, 0, DNNL_MAX_NDIMS);
      v.push_back(nb);
      v.insert(v.end(), b.inner_blks, b.inner_blks + nb);
      v.insert(v.end(), b.inner_idxs, b.inner_idxs + nb);
    }
    uint32_t scale = 0;
    std::memcpy(&scale, &d.extra.scale_adjust, sizeof scale);
    v.insert(v.end(), {static_cast<int64_t>(d.extra.flags), d.extra.compensation_mask, scale,
                       d.extra.asymm_compensation_mask});
  }
  const uint64_t h = XXH3_64bits(v.data(), v.size() * sizeof(int64_t));
  return h == 0 ? 1 : h;
}

const std::string& layout_identity() {
  static const std::string id = [] {
    const dnnl_version_t* ver = dnnl_version();
    using isa_t = dnnl::cpu_isa;
    static const std::pair<isa_t, const char*> names[] = {
        {isa_t::sse41, "sse41"},
        {isa_t::avx, "avx"},
        {isa_t::avx2, "avx2"},
        {isa_t::avx2_vnni, "avx2_vnni"},
        {isa_t::avx512_core, "avx512_core"},
        {isa_t::avx512_core_vnni, "avx512_core_vnni"},
        {isa_t::avx512_core_bf16, "avx512_core_bf16"},
        {isa_t::avx512_core_amx, "avx512_core_amx"}};
    const isa_t here = dnnl::get_effective_cpu_isa();
    std::string isa = "isa " + std::to_string(static_cast<int>(here));
    for (const auto& [value, name] : names)
      if (value == here) isa = name;
    return "onednn " + std::to_string(ver->major) + "." + std::to_string(ver->minor) + "." +
           std::to_string(ver->patch) + " " + isa;
  }();
  return id;
}

size_t weights_laid_out() { return laid_out.load(std::memory_order_relaxed); }

void execute(const char* op, const CachedPrimitive& p, const std::vector<void*>& buffers,
             const void* dst_init, int chosen_arg) {
  try {
    run(p, buffers, dst_init, chosen_arg);
  } catch (const dnnl::error& e) {
    fail<UnsupportedError>("[{}] oneDNN failed: {}", op, e.what());
  }
}

}  // namespace kiln::cpu::dnnl_util
