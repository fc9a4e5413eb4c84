// Reads packages (format and the checks in order: format.h). Nothing from the file is used
// before it has been checked: a malformed file gives a FormatError, never a crash.

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <numeric>

#include "backends/cpu/dnnl_util.h"
#include "core/device_backend.h"
#include "core/errors.h"
#include "core/op_registry.h"
#include "core/tuning.h"
#include "io/file.h"
#include "io/package/format.h"
#include "io/package/manifest_generated.h"
#include "io/package/validate.h"
#include "kiln/version.h"
#include "runtime/custom_op.h"
#include "runtime/env.h"
#include "runtime/executable_impl.h"
#include "runtime/log.h"
#include "runtime/shape_cache.h"
#include "runtime/thread_pool.h"

namespace kiln::package {

using detail::Node;
using detail::ValueRef;

namespace {
// 64-byte aligned memory of `size` bytes (rounded up) that frees itself with the returned owner.
std::shared_ptr<void> aligned_buffer(size_t size, const std::string& what) {
  const size_t rounded = (size + kSectionAlign - 1) / kSectionAlign * kSectionAlign;
  void* p = std::aligned_alloc(kSectionAlign, rounded);
  if (!p) fail<OutOfMemory>("[package] {}: cannot allocate {} bytes", what, size);
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

// Below this many bytes per chunk, reading on several threads costs more than it saves.
constexpr size_t kReadChunk = size_t{8} << 20;
}  // namespace

Bytes read_file(const std::string& path) {
  const io::RegularFile f(path, "[package]", "'" + path + "'");
  Bytes b;
  b.what = path;
  b.size = static_cast<size_t>(f.size());
  if (b.size == 0) return b;
  b.owner = aligned_buffer(b.size, path);
  auto* dst = static_cast<uint8_t*>(b.owner.get());
  // Large files in chunks on the global pool: reading from the page cache is a copy, and
  // several threads copy faster than one.
  const size_t chunks = (b.size + kReadChunk - 1) / kReadChunk;
  std::atomic<size_t> short_at{b.size};
  auto read_chunks = [&](int64_t begin, int64_t end) {
    for (auto c = static_cast<size_t>(begin); c < static_cast<size_t>(end); ++c) {
      const size_t off = c * kReadChunk, n = std::min(kReadChunk, b.size - off);
      if (const size_t got = f.read_at(dst + off, n, off); got < n) {
        size_t seen = short_at.load();
        while (off + got < seen && !short_at.compare_exchange_weak(seen, off + got)) {
        }
      }
    }
  };
  if (chunks > 1 && ThreadPool::global().size() > 1)
    ThreadPool::global().parallel_for(static_cast<int64_t>(chunks), 1, read_chunks);
  else
    read_chunks(0, static_cast<int64_t>(chunks));
  if (short_at.load() < b.size)
    fail<IoError>(
        "[package] '{}': reading failed at offset {} of {} bytes (did the file shrink "
        "while it was read?)",
        path, short_at.load(), b.size);
  b.data = dst;
  return b;
}

Bytes copy_bytes(const void* data, size_t size) {
  Bytes b;
  b.what = "<memory>";
  b.size = size;
  if (size == 0) return b;
  b.owner = aligned_buffer(size, b.what);
  std::memcpy(b.owner.get(), data, size);
  b.data = static_cast<const uint8_t*>(b.owner.get());
  return b;
}

namespace {
template <typename T>
T get(const uint8_t* p) {
  static_assert(std::endian::native == std::endian::little, "kiln packages are little endian");
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// a + b <= limit without overflow
bool fits(uint64_t a, uint64_t b, uint64_t limit) { return a <= limit && b <= limit - a; }

// A weight section whose place and size have been checked, and the XXH3 it must have.
struct WeightCheck {
  const uint8_t* data;
  uint64_t size, xxh3, offset;
  size_t node;
  int32_t section;
};

// Below this many bytes per thread, hashing on more threads costs more than it saves.
constexpr uint64_t kHashBytesPerThread = uint64_t{1} << 20;

// The index of the first check (in `checks`' order) whose bytes do not have its XXH3, or
// checks.size() when all do. Sections are hashed on the global pool, each whole by one thread
// (the stored value is the XXH3 of the whole section), the largest first so that the threads end
// together; the answer does not depend on the threads' timing.
size_t first_mismatch(const std::vector<WeightCheck>& checks) {
  const size_t n = checks.size();
  uint64_t total = 0;
  for (const WeightCheck& c : checks) total += c.size;
  ThreadPool& pool = ThreadPool::global();
  const auto workers = static_cast<int64_t>(
      std::min<uint64_t>({static_cast<uint64_t>(std::max(pool.size(), 1)), n,
                          std::max<uint64_t>(total / kHashBytesPerThread, 1)}));
  if (workers <= 1) {
    for (size_t i = 0; i < n; ++i)
      if (xxh3(checks[i].data, checks[i].size) != checks[i].xxh3) return i;
    return n;
  }
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return checks[a].size > checks[b].size; });
  std::atomic<size_t> next{0}, first_bad{n};
  pool.parallel_for(workers, 1, [&](int64_t, int64_t) {
    for (size_t j; (j = next.fetch_add(1, std::memory_order_relaxed)) < n;) {
      const size_t i = order[j];
      // a later section cannot be the first bad one once an earlier one is known bad
      if (i > first_bad.load(std::memory_order_relaxed)) continue;
      if (xxh3(checks[i].data, checks[i].size) == checks[i].xxh3) continue;
      size_t seen = first_bad.load(std::memory_order_relaxed);
      while (i < seen && !first_bad.compare_exchange_weak(seen, i, std::memory_order_relaxed)) {
      }
    }
  });
  return first_bad.load();
}

class Reader {
 public:
  Reader(const Bytes& bytes, Device device, const LoadOptions& options)
      : b_(bytes), device_(device), options_(options) {}

  std::shared_ptr<detail::ExecutableImpl> read();

 private:
  template <typename... Args>
  [[noreturn]] void bad(const std::string& where, uint64_t offset, fmt::format_string<Args...> f,
                        Args&&... args) const {
    throw FormatError(fmt::format("[package] {}: {} at offset {}: {}", b_.what, where, offset,
                                  fmt::format(f, std::forward<Args>(args)...)));
  }
  void read_header();
  const fb::Manifest* read_manifest();
  // A dynamic package: its program (read and checked) becomes a dynamic executable with the
  // options and output names `like` holds.
  std::shared_ptr<detail::ExecutableImpl> read_dynamic(const fb::Manifest& m, Program p,
                                                       const detail::ExecutableImpl& like,
                                                       PackageInfo info);
  Program read_program(const fb::Manifest& m);
  // Node `i` of `g` (earlier nodes read) from `f`, its bodies among bodies_; not yet checked.
  // `dynamic`: dims of -1 allowed (a dynamic package's program; any body, whose placeholders
  // keep the dims they were built with).
  detail::Node read_node(const fb::Node& f, const detail::GraphImpl& g, uint32_t i,
                         const std::string& where, bool dynamic);
  // The bodies of control-flow nodes (Manifest.bodies), checked, into bodies_.
  void read_bodies(const fb::Manifest& m);
  void read_sections(const fb::Manifest& m, Program& p);
  MemoryPlan read_plan(const fb::Manifest& m, const Program& p);
  void read_steps(const fb::Manifest& m, const Program& p, detail::ExecutableImpl& impl,
                  Backend target);
  // Checks the tuning sections; on a device of their backend, seeds its choices when they hold
  // for the device, else warns (strict: throws).
  // The bytes of a tuning or kernel section after checking its range (inside the file, after
  // the header, 64-byte aligned, at most `max` bytes, at least `min`) and its XXH3.
  const uint8_t* checked_section(const std::string& where, uint64_t offset, uint64_t size,
                                 uint64_t xxh3_sum, uint64_t min, uint64_t max, const char* kind);
  void read_tuning(const fb::Manifest& m, detail::ExecutableImpl& impl);
  // Checks the kernel binaries; on a device of their backend, offers them to it, so that its
  // generated kernels are loaded instead of compiled.
  void read_kernels(const fb::Manifest& m, detail::ExecutableImpl& impl);
  // Checks the laid-out weights; on the CPU, where they were laid out by the same library on the
  // same instruction set, gives each to its node's kernel state (after attach_program).
  void read_laid_out(const fb::Manifest& m, detail::ExecutableImpl& impl);
  // On a GPU, copies the constants to it (attach_program then finds them there).
  void upload_constants(Program& p);
  // A dynamic package (metadata.dynamic): dims of -1 are allowed outside constants and variables.
  bool dynamic_ = false;
  std::vector<std::shared_ptr<const Body>> bodies_;
  std::vector<uint8_t> body_used_;
  // The verifier checks vectors' length fields, not that 8-byte elements are 8-byte aligned.
  template <typename V>
  const V* aligned(const V* v, const std::string& where) const {
    if (v && v->size() > 0 && reinterpret_cast<uintptr_t>(v->Data()) % 8 != 0)
      bad(where, at(v), "a vector of 8-byte values is not 8-byte aligned");
    return v;
  }
  // where manifest object `p` starts in the file, for messages
  uint64_t at(const void* p) const {
    return static_cast<uint64_t>(static_cast<const uint8_t*>(p) - b_.data);
  }
  std::string node_where(const Program& p, size_t i) const {
    return fmt::format("manifest node %{} ({} '{}')", i, op_name(p.graph.nodes[i].op),
                       p.graph.nodes[i].name);
  }
  static std::string section_where(const Program& p, size_t i, int32_t k) {
    return fmt::format("section {} ({} '{}')", k, op_name(p.graph.nodes[i].op),
                       p.graph.nodes[i].name);
  }

  const Bytes& b_;
  Device device_;
  LoadOptions options_;
  uint64_t manifest_offset_ = 0, manifest_size_ = 0;
};

void Reader::read_header() {
  const uint8_t* d = b_.data;
  if (b_.size < kHeaderBytes)
    bad("header", 0, "the file has {} bytes; a package has at least {}", b_.size, kHeaderBytes);
  if (std::memcmp(d + header::magic, kMagic, 8) != 0)
    bad("header", 0, "not a kiln package (bad magic)");
  const auto version = get<uint32_t>(d + header::format_version);
  const auto min_reader = get<uint32_t>(d + header::min_reader_version);
  if (min_reader > kReaderVersion)
    bad("header", header::min_reader_version,
        "format version {} needs a reader of version {} or newer; this kiln ({}) reads versions "
        "up to {}",
        version, min_reader, kiln::version(), kReaderVersion);
  if (const uint64_t want = get<uint64_t>(d + header::header_xxh3);
      xxh3(d, header::header_xxh3) != want)
    bad("header", header::header_xxh3, "checksum mismatch");
  if (get<uint64_t>(d + header::reserved) != 0)
    bad("header", header::reserved, "reserved bytes are not 0");
  if (version < min_reader)
    bad("header", header::format_version, "format version {} < minimum reader version {}", version,
        min_reader);
  if (const uint64_t size = get<uint64_t>(d + header::file_size); size != b_.size)
    bad("header", header::file_size,
        "the header says the file has {} bytes but it has {} "
        "(truncated or extended)",
        size, b_.size);
  manifest_offset_ = get<uint64_t>(d + header::manifest_offset);
  manifest_size_ = get<uint64_t>(d + header::manifest_size);
  if (manifest_offset_ < kHeaderBytes || !fits(manifest_offset_, manifest_size_, b_.size))
    bad("header", header::manifest_offset,
        "manifest range [{}, +{}) is outside the file of {} bytes", manifest_offset_,
        manifest_size_, b_.size);
  if (manifest_offset_ % kManifestAlign != 0)
    bad("header", header::manifest_offset, "manifest offset {} is not a multiple of {}",
        manifest_offset_, kManifestAlign);
}

const fb::Manifest* Reader::read_manifest() {
  const uint8_t* m = b_.data + manifest_offset_;
  if (xxh3(m, manifest_size_) != get<uint64_t>(b_.data + header::manifest_xxh3))
    bad("manifest", manifest_offset_, "checksum mismatch");
  if (manifest_size_ >= FLATBUFFERS_MAX_BUFFER_SIZE)
    bad("manifest", manifest_offset_, "{} bytes is more than FlatBuffers allows", manifest_size_);
  flatbuffers::Verifier v(m, manifest_size_, /*max_depth=*/64, /*max_tables=*/1u << 26);
  if (!fb::VerifyManifestBuffer(v))
    bad("manifest", manifest_offset_, "does not pass the FlatBuffers verifier");
  const fb::Manifest* man = fb::GetManifest(m);
  if (!man->metadata() || !man->nodes() || !man->outputs() || !man->slots() || !man->steps())
    bad("manifest", manifest_offset_,
        "a required table (metadata, nodes, outputs, slots, steps) is missing");
  return man;
}

Node Reader::read_node(const fb::Node& f, const detail::GraphImpl& g, uint32_t i,
                       const std::string& where, bool dynamic) {
  const auto& nodes = g.nodes;
  Node n;
  if (!op_from_id(f.op(), n.op)) bad(where, at(&f), "unknown op id {}", f.op());
  if (f.name()) n.name = f.name()->str();
  n.origin = f.origin();
  if (f.inputs())
    for (const fb::ValueRef* v : *f.inputs()) {
      if (v->node() < 0 || static_cast<uint32_t>(v->node()) >= i)
        bad(where, at(v), "input %{} is not an earlier node", v->node());
      const Node& src = nodes[v->node()];
      if (v->index() < 0 || static_cast<size_t>(v->index()) >= src.outputs.size())
        bad(where, at(v), "input %{} has no output {}", v->node(), v->index());
      n.inputs.push_back({v->node(), v->index()});
    }
  if (f.attrs())
    for (const fb::Attr* a : *f.attrs()) {
      const std::string key = a->key()->str();
      switch (a->kind()) {
        case fb::AttrKind_Bool:
          n.attrs.set(key, a->i() != 0);
          break;
        case fb::AttrKind_Int:
          n.attrs.set(key, static_cast<int64_t>(a->i()));
          break;
        case fb::AttrKind_Float:
          n.attrs.set(key, a->f());
          break;
        case fb::AttrKind_Ints:
          n.attrs.set(key, aligned(a->ints(), where)
                               ? std::vector<int64_t>(a->ints()->begin(), a->ints()->end())
                               : std::vector<int64_t>{});
          break;
        case fb::AttrKind_Floats:
          n.attrs.set(key, aligned(a->floats(), where)
                               ? std::vector<double>(a->floats()->begin(), a->floats()->end())
                               : std::vector<double>{});
          break;
        case fb::AttrKind_String:
          n.attrs.set(key, a->s() ? a->s()->str() : std::string());
          break;
        case fb::AttrKind_DType:
          if (a->i() < 0 || a->i() >= kNumDTypes)
            bad(where, at(a), "attribute '{}': unknown dtype {}", key, a->i());
          n.attrs.set(key, static_cast<DType>(a->i()));
          break;
        default:
          bad(where, at(a), "attribute '{}' of unknown kind {}", key, static_cast<int>(a->kind()));
      }
    }
  if (f.outputs())
    for (const fb::TensorInfo* t : *f.outputs()) {
      TensorInfo info;
      if (t->dtype() >= kNumDTypes) bad(where, at(t), "unknown dtype {}", t->dtype());
      info.dtype = static_cast<DType>(t->dtype());
      if (aligned(t->shape(), where)) info.shape.assign(t->shape()->begin(), t->shape()->end());
      if (const std::string why = check_shape(info, dynamic); !why.empty())
        bad(where, at(t), "{}", why);
      n.outputs.push_back(std::move(info));
    }
  // a conv with a fused epilogue is fused_conv's node: files written before it held conv
  if (n.op == OpId::Conv && (n.attrs.has("relu") || n.attrs.has("has_residual")))
    n.op = OpId::FusedConv;
  // a custom op must be registered before its node can be checked (runtime/custom_op.h)
  if (detail::is_custom(n.op))
    if (const std::string why = detail::custom_op_missing(n.attrs); !why.empty())
      fail<UnsupportedError>("[package] {}: {} ('{}'): {}", b_.what, where, n.name, why);
  // a control-flow node's bodies: read before the program, each only after those it holds
  if (f.bodies())
    for (const int32_t k : *f.bodies()) {
      if (k < 0 || static_cast<size_t>(k) >= bodies_.size())
        bad(where, at(f.bodies()), "body {} is not a body read before it", k);
      // each body belongs to one node: bodies form trees, which inference walks once per level
      if (body_used_[k]++) bad(where, at(f.bodies()), "body {} belongs to another node", k);
      n.bodies.push_back(bodies_[k]);
    }
  return n;
}

void Reader::read_bodies(const fb::Manifest& m) {
  if (!m.bodies()) return;
  std::vector<int> depth;
  for (uint32_t k = 0; k < m.bodies()->size(); ++k) {
    const fb::Body& fb_body = *m.bodies()->Get(k);
    auto body = std::make_shared<Body>();
    int d = 1;
    const std::string in_body = fmt::format("manifest body {}", k);
    if (fb_body.nodes())
      for (uint32_t i = 0; i < fb_body.nodes()->size(); ++i) {
        const fb::Node& f = *fb_body.nodes()->Get(i);
        const std::string where = fmt::format("{} node %{}", in_body, i);
        if (f.bodies())
          for (const int32_t c : *f.bodies())
            if (c >= 0 && static_cast<uint32_t>(c) < k) d = std::max(d, depth[c] + 1);
        if (d > kMaxBodyDepth) bad(where, at(&f), "bodies nest more than {} deep", kMaxBodyDepth);
        Node n = read_node(f, body->graph, i, where, true);
        if (n.op == OpId::Variable) bad(where, at(&f), "a body holds no variables");
        if (n.op == OpId::Constant) {
          if (n.outputs.size() != 1)
            bad(where, at(&f), "a constant with {} outputs (it has one)", n.outputs.size());
          const TensorInfo& t = n.outputs[0];
          if (const std::string why = check_shape(t); !why.empty()) bad(where, at(&f), "{}", why);
          const uint64_t want = static_cast<uint64_t>(numel(t.shape)) * size_of(t.dtype);
          const uint64_t got = f.value() ? f.value()->size() : 0;
          if (want > kMaxBodyConstantBytes || got != want)
            bad(where, at(&f), "a body constant of {} {} holds {} bytes (at most {})",
                name(t.dtype), str(t.shape), got, kMaxBodyConstantBytes);
          n.value = Array::from_data(got ? f.value()->data() : nullptr, t.shape, t.dtype);
        }
        body->graph.nodes.push_back(std::move(n));
        if (const std::string why = check_node(body->graph, i); !why.empty())
          bad(fmt::format("{} ({})", where, op_name(body->graph.nodes[i].op)), at(&f), "{}", why);
      }
    const auto& nodes = body->graph.nodes;
    std::vector<char> bound(nodes.size(), 0);
    if (fb_body.operands())
      for (const int32_t ph : *fb_body.operands()) {
        if (ph != -1 && (ph < 0 || static_cast<size_t>(ph) >= nodes.size() ||
                         nodes[ph].op != OpId::Placeholder || bound[ph]))
          bad(in_body, at(fb_body.operands()), "operand {} is not a placeholder of the body", ph);
        if (ph >= 0) bound[ph] = 1;
        body->operands.push_back(ph);
      }
    for (size_t i = 0; i < nodes.size(); ++i)
      if (nodes[i].op == OpId::Placeholder && !bound[i])
        bad(in_body, at(&fb_body), "placeholder %{} takes no operand", i);
    if (fb_body.results())
      for (const fb::ValueRef* v : *fb_body.results()) {
        if (v->node() < 0 || static_cast<size_t>(v->node()) >= nodes.size() || v->index() < 0 ||
            static_cast<size_t>(v->index()) >= nodes[v->node()].outputs.size())
          bad(in_body, at(v), "result %{}:{} is not a value of the body", v->node(), v->index());
        body->results.push_back({v->node(), v->index()});
      }
    depth.push_back(d);
    bodies_.push_back(std::move(body));
    body_used_.push_back(0);
  }
}

Program Reader::read_program(const fb::Manifest& m) {
  Program p;
  auto& nodes = p.graph.nodes;
  const auto& fnodes = *m.nodes();
  if (fnodes.size() > static_cast<uint32_t>(std::numeric_limits<int32_t>::max()))
    bad("manifest", at(&fnodes), "{} nodes", fnodes.size());
  nodes.reserve(fnodes.size());
  for (uint32_t i = 0; i < fnodes.size(); ++i) {
    const fb::Node& f = *fnodes.Get(i);
    Node n = read_node(f, p.graph, i, fmt::format("manifest node %{}", i), dynamic_);
    nodes.push_back(std::move(n));
    if (const std::string why = check_node(p.graph, i); !why.empty())
      bad(fmt::format("manifest node %{} ({} '{}')", i, op_name(nodes[i].op), nodes[i].name),
          at(&f), "{}", why);
  }
  for (const fb::ValueRef* v : *m.outputs()) {
    if (v->node() < 0 || static_cast<uint32_t>(v->node()) >= nodes.size() || v->index() < 0 ||
        static_cast<size_t>(v->index()) >= nodes[v->node()].outputs.size())
      bad("manifest outputs", at(v), "%{}:{} is not a value of the program", v->node(), v->index());
    p.outputs.push_back({v->node(), v->index()});
  }
  if (m.num_returned() > p.outputs.size())
    bad("manifest outputs", at(m.outputs()), "{} returned of {} outputs", m.num_returned(),
        p.outputs.size());
  p.num_returned = m.num_returned();
  return p;
}

void Reader::read_sections(const fb::Manifest& m, Program& p) {
  auto& nodes = p.graph.nodes;
  const uint32_t count = aligned(m.sections(), "manifest sections") ? m.sections()->size() : 0;
  std::vector<char> used(count, 0);
  // First every section's place and size, in node order; the checksums after, in parallel. The
  // error reported is the one the node-order loop "place, size, then checksum of each node" meets
  // first: a checksum mismatch of an earlier node before a bad place of a later one.
  std::vector<WeightCheck> checks;
  std::exception_ptr bad_place;
  for (size_t i = 0; i < nodes.size() && !bad_place; ++i) {
    try {
      Node& n = nodes[i];
      const fb::Node& f = *m.nodes()->Get(static_cast<uint32_t>(i));
      const int32_t k = f.section();
      const bool has_data = n.op == OpId::Constant || n.op == OpId::Variable;
      if (!has_data) {
        if (k != -1)
          bad(node_where(p, i), at(&f), "only constants and variables have data sections");
        continue;
      }
      if (k < 0 || static_cast<uint32_t>(k) >= count || used[k])
        bad(node_where(p, i), at(&f),
            "data section {} is not a section of the file's {} (or is used twice)", k, count);
      used[k] = 1;
      const fb::Section& s = *m.sections()->Get(static_cast<uint32_t>(k));
      if (s.node() != static_cast<int32_t>(i))
        bad(section_where(p, i, k), s.offset(), "belongs to node %{}, not %{}", s.node(), i);
      const TensorInfo& t = n.outputs[0];
      if (!is_static(t.shape))
        bad(node_where(p, i), at(&f), "a constant or variable of dynamic shape {}", str(t.shape));
      const uint64_t want = static_cast<uint64_t>(numel(t.shape)) * size_of(t.dtype);
      if (s.size() != want)
        bad(section_where(p, i, k), s.offset(), "{} bytes; {} {} needs {}", s.size(), name(t.dtype),
            str(t.shape), want);
      if (s.offset() < kHeaderBytes || !fits(s.offset(), s.size(), b_.size))
        bad(section_where(p, i, k), s.offset(), "range [{}, +{}) is outside the file of {} bytes",
            s.offset(), s.size(), b_.size);
      if (s.offset() % kSectionAlign != 0)
        bad(section_where(p, i, k), s.offset(), "offset is not a multiple of {}", kSectionAlign);
      checks.push_back({b_.data + s.offset(), s.size(), s.xxh3(), s.offset(), i, k});
    } catch (...) {
      bad_place = std::current_exception();
    }
  }
  if (options_.verify_weights) {
    const size_t first_bad = first_mismatch(checks);
    if (first_bad < checks.size()) {
      const WeightCheck& c = checks[first_bad];
      bad(section_where(p, c.node, c.section), c.offset, "checksum mismatch");
    }
  }
  if (bad_place) std::rethrow_exception(bad_place);
  for (const WeightCheck& c : checks) {
    Node& n = nodes[c.node];
    const TensorInfo& t = n.outputs[0];
    if (n.op == OpId::Variable) {
      // a loaded executable owns its variables and updates them
      n.value = Array::from_data(c.data, t.shape, t.dtype);
    } else {
      n.value = Array::wrap(const_cast<uint8_t*>(c.data), t.shape, t.dtype, b_.owner);
    }
  }
}

MemoryPlan Reader::read_plan(const fb::Manifest& m, const Program& p) {
  const auto& nodes = p.graph.nodes;
  MemoryPlan plan;
  const auto& rows = *m.slots();
  if (rows.size() != nodes.size())
    bad("manifest plan", at(&rows), "{} rows of slots for {} nodes", rows.size(), nodes.size());
  plan.arena_bytes = m.arena_bytes();
  plan.num_buffers = m.num_buffers();
  plan.slots.resize(nodes.size());
  for (uint32_t i = 0; i < rows.size(); ++i) {
    const fb::NodeSlots& r = *rows.Get(i);
    const uint32_t count = aligned(r.slots(), "manifest plan") ? r.slots()->size() : 0;
    if (count != nodes[i].outputs.size())
      bad("manifest plan", at(&r), "node %{} has {} outputs but {} slots", i,
          nodes[i].outputs.size(), count);
    for (uint32_t o = 0; o < count; ++o) {
      const fb::Slot& s = *r.slots()->Get(o);
      if (s.where() > static_cast<uint8_t>(ValueSlot::Where::output))
        bad("manifest plan", at(&s), "slot of %{}:{} has unknown kind {}", i, o, s.where());
      plan.slots[i].push_back({static_cast<ValueSlot::Where>(s.where()),
                               static_cast<size_t>(s.offset()), s.index(), s.storage()});
    }
  }
  if (const std::string why = check_plan(p, plan); !why.empty())
    bad("manifest plan", at(&rows), "{}", why);
  return plan;
}

void Reader::read_steps(const fb::Manifest& m, const Program& p, detail::ExecutableImpl& impl,
                        Backend target) {
  const auto& nodes = p.graph.nodes;
  for (const fb::Step* f : *m.steps()) {
    Step st;
    st.node = f->node();
    if (st.node < 0 || static_cast<size_t>(st.node) >= nodes.size())
      bad("manifest steps", at(f), "node %{} is not a node of the program", st.node);
    if (f->backend() > static_cast<uint8_t>(Backend::cuda))
      bad("manifest steps", at(f), "unknown backend {}", f->backend());
    st.backend = static_cast<Backend>(f->backend());
    if (f->fallback_reason()) st.fallback_reason = f->fallback_reason()->str();
    impl.steps.push_back(std::move(st));
  }
  if (const std::string why = check_steps(p, impl.steps, target); !why.empty())
    bad("manifest steps", at(m.steps()), "{}", why);
  for (int32_t i = 0; i < static_cast<int32_t>(nodes.size()); ++i)
    if (nodes[i].op == OpId::Placeholder) impl.placeholders.push_back(i);
  for (Step& st : impl.steps) {
    const Node& n = nodes[st.node];
    st.kernel = find_kernel(n.op, st.backend, layout_of(n.op, n.attrs));
    impl.reports_errors = impl.reports_errors || st.kernel->reports_errors;
  }
}

const uint8_t* Reader::checked_section(const std::string& where, uint64_t offset, uint64_t size,
                                      uint64_t xxh3_sum, uint64_t min, uint64_t max,
                                      const char* kind) {
  if (size < min || size > max)
    bad(where, offset, "{} bytes; {} sections hold {}{}", size, kind,
        min == 0 ? "at most " : fmt::format("{} to ", min), max);
  if (offset < kHeaderBytes || !fits(offset, size, b_.size))
    bad(where, offset, "range [{}, +{}) is outside the file of {} bytes", offset, size, b_.size);
  if (offset % kSectionAlign != 0)
    bad(where, offset, "offset is not a multiple of {}", kSectionAlign);
  const uint8_t* data = b_.data + offset;
  if (xxh3(data, size) != xxh3_sum) bad(where, offset, "checksum mismatch");
  return data;
}

void Reader::read_tuning(const fb::Manifest& m, detail::ExecutableImpl& impl) {
  if (!m.tuning()) return;
  constexpr uint64_t kMaxTuningBytes = uint64_t{16} << 20;
  std::vector<char> seen(kNumBackends, 0);
  for (uint32_t i = 0; i < m.tuning()->size(); ++i) {
    const fb::Tuning& t = *m.tuning()->Get(i);
    if (t.backend() >= kNumBackends)
      bad(fmt::format("tuning section {}", i), at(&t), "unknown backend {}", t.backend());
    const auto backend = static_cast<Backend>(t.backend());
    const std::string where = fmt::format("tuning section {} ({})", i, backend_name(backend));
    if (seen[t.backend()]++) bad(where, at(&t), "a second tuning section for the backend");
    const uint8_t* data =
        checked_section(where, t.offset(), t.size(), t.xxh3(), 0, kMaxTuningBytes, "tuning");
    TuningParse parsed = parse_tuning(data, t.size());
    if (!parsed.error.empty()) bad(where, t.offset() + parsed.error_offset, "{}", parsed.error);
    TuningIdentity stored;
    if (t.device()) stored.device = t.device()->str();
    if (t.arch()) stored.arch = t.arch()->str();
    if (t.library()) stored.library = t.library()->str();

    // only a device of the section's backend uses it (a CPU load checks it and goes on)
    if (!impl.backend || backend != Backend::cuda || device_.kind != Device::Kind::cuda) continue;
    if (parsed.version == kTuningVersion && parsed.records.empty()) continue;  // nothing to use
    const TuningIdentity here = impl.backend->tuning_identity(device_.index);
    std::string why;
    if (parsed.version != kTuningVersion)
      why = fmt::format("its blob is of version {}; this kiln reads {}", parsed.version,
                        kTuningVersion);
    else if (!(stored == here))
      why = fmt::format("they were chosen on {}, not on {}", stored.str(), here.str());
    if (why.empty()) {
      size_t seeded = 0;
      if (std::string bad_record = impl.backend->import_tuning(device_.index, parsed.records,
                                                               &seeded);
          !bad_record.empty())
        bad(where, t.offset(), "{}", bad_record);
      continue;
    }
    const std::string msg = fmt::format(
        "[package] {}: the tuning decisions in {} are not used on {}: {}; the first run measures "
        "again",
        b_.what, where, device_.str(), why);
    if (options_.strict) fail<UnsupportedError>("{} (not allowed with LoadOptions::strict)", msg);
    log::warn("{}", msg);
  }
}

void Reader::read_kernels(const fb::Manifest& m, detail::ExecutableImpl& impl) {
  if (!m.kernels()) return;
  constexpr uint64_t kMaxKernelBytes = uint64_t{64} << 20;
  std::vector<KernelBinary> offered;
  for (uint32_t i = 0; i < m.kernels()->size(); ++i) {
    const fb::Kernel& k = *m.kernels()->Get(i);
    const std::string where = fmt::format("kernel section {}", i);
    if (k.backend() != static_cast<uint8_t>(Backend::cuda))
      bad(where, at(&k), "unknown backend {} for a generated kernel", k.backend());
    const uint8_t* data =
        checked_section(where, k.offset(), k.size(), k.xxh3(), 1, kMaxKernelBytes, "kernel");
    if (!impl.backend || device_.kind != Device::Kind::cuda) continue;  // checked, not used
    offered.push_back({k.arch() ? k.arch()->str() : std::string(), k.key(),
                       std::vector<char>(data, data + k.size())});
  }
  if (!offered.empty()) impl.backend->import_kernels(device_.index, offered);
}

void Reader::read_laid_out(const fb::Manifest& m, detail::ExecutableImpl& impl) {
  const auto& nodes = impl.program.graph.nodes;
  std::vector<char> seen(nodes.size(), 0);
  const std::string& here = cpu::dnnl_util::layout_identity();
  PackageInfo& info = *impl.package;
  for (uint32_t i = 0; m.laid_out() && i < m.laid_out()->size(); ++i) {
    const fb::LaidOut& w = *m.laid_out()->Get(i);
    const std::string where = fmt::format("laid-out weight {}", i);
    if (w.node() < 0 || static_cast<size_t>(w.node()) >= nodes.size())
      bad(where, at(&w), "node {} is not a node of the program's {}", w.node(), nodes.size());
    const Node& n = nodes[w.node()];
    KernelState* state = n.params ? n.params->kernel_state() : nullptr;
    if (!state)
      bad(where, at(&w), "node %{} ({} '{}') lays out no weight", w.node(), op_name(n.op), n.name);
    if (seen[w.node()]++) bad(where, at(&w), "a second laid-out weight of node %{}", w.node());
    const uint8_t* data =
        checked_section(where, w.offset(), w.size(), w.xxh3(), 1, b_.size, "laid-out weight");
    info.laid_out_for = w.identity() ? w.identity()->str() : std::string();
    ++info.laid_out_weights;
    if (device_.kind != Device::Kind::cpu || info.laid_out_for != here) continue;  // checked only
    ++info.laid_out_taken;
    std::lock_guard<std::mutex> lock(state->mu);
    state->stored = std::shared_ptr<const void>(b_.owner, data);
    state->stored_layout = w.layout();
    state->stored_size = w.size();
  }
  if (device_.kind == Device::Kind::cpu && info.laid_out_taken < info.laid_out_weights)
    log::info(
        "[package] {}: laid-out weights for '{}', not this CPU's '{}': the first run lays "
        "them out again",
        b_.what, info.laid_out_for, here);
}

void Reader::upload_constants(Program& p) {
  if (device_.kind == Device::Kind::cpu) return;
  // One batch: the backend stages the mapped file through pinned buffers from several threads,
  // overlapping the host copies with the transfers, and waits once.
  DeviceBackend* b = backend_of(device_);
  std::vector<DeviceBackend::HostUpload> uploads;
  std::vector<Array> keep;  // the mapped host values until the copies are done
  for (Node& n : p.graph.nodes) {
    if (n.op != OpId::Constant || n.value.device().kind != Device::Kind::cpu) continue;
    Array d = Array::empty(n.value.shape(), n.value.dtype(), device_);
    if (d.nbytes() > 0) uploads.push_back({d.data(), n.value.data(), d.nbytes()});
    keep.push_back(std::move(n.value));
    n.value = std::move(d);
  }
  b->upload_all(device_.index, uploads);
}

std::shared_ptr<detail::ExecutableImpl> Reader::read_dynamic(const fb::Manifest& m, Program p,
                                                             const detail::ExecutableImpl& like,
                                                             PackageInfo info) {
  const auto& meta = *m.metadata();
  if (m.slots()->size() != 0 || m.steps()->size() != 0 || (m.tuning() && m.tuning()->size()) ||
      (m.kernels() && m.kernels()->size()) || (m.laid_out() && m.laid_out()->size()))
    bad("manifest", at(m.slots()),
        "a dynamic package holds no plan, steps, tuning, kernels or laid-out weights");
  for (size_t i = 0; i < p.graph.nodes.size(); ++i)
    if (p.graph.nodes[i].op == OpId::Placeholder)
      if (const std::string why = check_dim_specs(p.graph.nodes[i]); !why.empty())
        bad(node_where(p, i), at(m.nodes()->Get(static_cast<uint32_t>(i))), "{}", why);
  CompileOptions o = like.options;
  o.max_specializations = meta.max_specializations();
  o.max_specialization_bytes = meta.max_specialization_bytes();
  info.compiled_for = "any (dynamic)";
  auto impl = detail::make_dynamic(std::move(p), device_, o, nullptr);
  impl->output_names = like.output_names;
  impl->package = std::move(info);
  return impl;
}

std::shared_ptr<detail::ExecutableImpl> Reader::read() {
  read_header();
  const fb::Manifest& m = *read_manifest();
  const fb::Metadata& meta = *m.metadata();

  auto impl = std::make_shared<detail::ExecutableImpl>();
  impl->device = device_;
  CompileOptions& o = impl->options;
  o.optimize = meta.optimize();
  o.plan_memory = meta.plan_memory();
  o.in_place = meta.in_place();
  o.num_threads = std::clamp(meta.num_threads(), 0, 256);
  if (meta.autocast() != kNoAutocast) {
    if (meta.autocast() >= kNumDTypes)
      bad("manifest metadata", at(&meta), "unknown autocast dtype {}", meta.autocast());
    o.autocast = static_cast<DType>(meta.autocast());
  }
  o.strict_placement = meta.strict_placement();
  env::override_kernel_choices(o.kernels);
  if (meta.device_kind() > static_cast<uint8_t>(Device::Kind::cuda))
    bad("manifest metadata", at(&meta), "unknown device kind {}", meta.device_kind());
  const Device compiled_for{static_cast<Device::Kind>(meta.device_kind()),
                            std::max(0, meta.device_index())};

  PackageInfo info;
  info.path = b_.what;
  if (meta.producer()) info.producer = meta.producer()->str();
  if (meta.kiln_version()) info.kiln_version = meta.kiln_version()->str();
  if (meta.source_hash()) info.source_hash = meta.source_hash()->str();
  info.compiled_for = compiled_for.str();
  info.format_version = get<uint32_t>(b_.data + header::format_version);
  info.file_bytes = b_.size;
  info.data_bytes = manifest_offset_ - kHeaderBytes;
  info.manifest_bytes = manifest_size_;

  dynamic_ = meta.dynamic();
  read_bodies(m);
  Program p = read_program(m);
  read_sections(m, p);
  if (m.output_names()) {
    if (m.output_names()->size() != p.num_returned)
      bad("manifest outputs", at(m.output_names()), "{} names for {} returned values",
          m.output_names()->size(), p.num_returned);
    for (const auto* s : *m.output_names()) impl->output_names.push_back(s->str());
  }
  if (dynamic_) return read_dynamic(m, std::move(p), *impl, std::move(info));
  // the stored plan is checked even when it is replaced below
  impl->plan = read_plan(m, p);
  const std::string msg =
      fmt::format("[package] {}: compiled for {}, loaded for {}: placing and planning it again",
                  b_.what, compiled_for.str(), device_.str());
  if (compiled_for.kind != device_.kind && options_.strict)
    fail<UnsupportedError>("{} is not allowed with LoadOptions::strict", msg);
  impl->backend = backend_of(device_);  // throws when the device is not there
  if (compiled_for.kind == device_.kind) {
    read_steps(m, p, *impl, backend_for(device_));
  } else {
    log::warn("{}", msg);
    place(p, device_, o.strict_placement, *impl);
    impl->plan = plan_memory(p, {o.plan_memory, o.in_place, backend_for(device_) == Backend::cpu});
    info.replanned = true;
  }
  read_tuning(m, *impl);
  read_kernels(m, *impl);
  impl->package = std::move(info);
  upload_constants(p);
  attach_program(*impl, std::move(p));
  read_laid_out(m, *impl);
  return impl;
}
}  // namespace

std::shared_ptr<detail::ExecutableImpl> read(const Bytes& bytes, Device device,
                                             const LoadOptions& options) {
  return Reader(bytes, device, options).read();
}

}  // namespace kiln::package
