// The custom-op registry, the Stream kernels encode into, the kernel-table entries that dispatch
// to registered kernels, and op libraries (dlopen).
#include "runtime/custom_op.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <shared_mutex>

#include "core/device_backend.h"
#include "core/errors.h"

namespace kiln {

using detail::CustomOpEntry;

namespace {

struct Registry {
  std::shared_mutex mu;
  std::map<std::string, std::shared_ptr<const CustomOpEntry>> ops;
};
Registry& registry() {
  static Registry r;
  return r;
}

void check_def(const CustomOpDef& d) {
  if (d.name.empty()) fail<ValueError>("[register_custom_op] an op needs a name");
  for (char ch : d.name)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_' && ch != '.')
      fail<ValueError>("[register_custom_op] op name '{}' may hold only letters, digits, '_', '.'",
                       d.name);
  if (d.inputs.empty()) fail<ValueError>("[{}] a custom op needs at least one input", d.name);
  if (d.outputs.empty()) fail<ValueError>("[{}] a custom op needs at least one output", d.name);
  for (const auto& in : d.inputs)
    if (in.dtypes.empty()) fail<ValueError>("[{}] input '{}' takes no dtype", d.name, in.name);
  for (const auto& out : d.outputs)
    if (out.like_input >= static_cast<int>(d.inputs.size()))
      fail<ValueError>("[{}] output '{}' takes the dtype of input {}, but the op has {} inputs",
                       d.name, out.name, out.like_input, d.inputs.size());
  std::set<std::string> keys;
  for (const auto& [k, v] : d.attrs) {
    if (k.rfind("custom_", 0) == 0)
      fail<ValueError>("[{}] attribute '{}': keys starting with 'custom_' are kiln's", d.name, k);
    if (!keys.insert(k).second) fail<ValueError>("[{}] attribute '{}' declared twice", d.name, k);
  }
}

// Inserts every def at once, or none when a name is taken.
void insert_all(std::vector<std::shared_ptr<CustomOpEntry>> entries, const std::string& who) {
  auto& r = registry();
  std::unique_lock lock(r.mu);
  std::set<std::string> names;
  for (const auto& e : entries) {
    if (auto it = r.ops.find(e->def.name); it != r.ops.end())
      fail<ValueError>("[{}] custom op '{}' is registered already{}", who, e->def.name,
                       it->second->def.library.empty()
                           ? std::string()
                           : fmt::format(" (by op library '{}')", it->second->def.library));
    if (!names.insert(e->def.name).second)
      fail<ValueError>("[{}] registers custom op '{}' twice", who, e->def.name);
  }
  for (auto& e : entries) r.ops.emplace(e->def.name, std::move(e));
}

std::mutex& stream_lock(void* native) {
  static std::array<std::mutex, 64> locks;
  return locks[(reinterpret_cast<uintptr_t>(native) >> 4) % locks.size()];
}

// The kernel-table entry of `custom` on both backends: the node's registered kernel, run on the
// step's stream.
template <Backend B>
void dispatch_kernel(KernelContext& ctx) {
  const auto entry = detail::custom_op_of(ctx.attrs());
  const CustomKernel& k = entry->kernels[static_cast<int>(B)];
  if (!k)
    fail<UnsupportedError>("[{}] custom op has no {} kernel", entry->def.name, backend_name(B));
  Stream stream(B, ctx.device(), ctx.stream());
  k(ctx, stream);
}

}  // namespace

void Stream::dispatch(const std::function<void()>& encode) {
  std::lock_guard lock(stream_lock(native_));
  encode();
}

void Stream::commit() {}

void Stream::commit_and_wait() {
  if (backend_ == Backend::cpu || !native_) return;
  if (DeviceBackend* b = device_backend(backend_)) b->synchronize(device_, native_);
}

void register_custom_op(CustomOpDef def) {
  check_def(def);
  auto e = std::make_shared<CustomOpEntry>();
  e->def = std::move(def);
  insert_all({std::move(e)}, "register_custom_op");
}

void register_custom_kernel(const std::string& op, Backend backend, CustomKernel kernel) {
  auto& r = registry();
  std::unique_lock lock(r.mu);
  auto it = r.ops.find(op);
  if (it == r.ops.end())
    fail<ValueError>("[register_custom_kernel] custom op '{}' is not registered", op);
  if (!kernel)
    fail<ValueError>("[register_custom_kernel] empty {} kernel for '{}'", backend_name(backend),
                     op);
  auto e = std::make_shared<CustomOpEntry>(*it->second);
  e->kernels[static_cast<int>(backend)] = std::move(kernel);
  it->second = std::move(e);
}

bool unregister_custom_op(const std::string& op) {
  auto& r = registry();
  std::unique_lock lock(r.mu);
  return r.ops.erase(op) > 0;
}

bool is_custom_op_registered(const std::string& op) {
  return detail::find_custom_op(op) != nullptr;
}

std::vector<std::string> custom_op_names() {
  auto& r = registry();
  std::shared_lock lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [k, v] : r.ops) names.push_back(k);
  return names;
}

namespace detail {

std::shared_ptr<const CustomOpEntry> find_custom_op(const std::string& name) {
  auto& r = registry();
  std::shared_lock lock(r.mu);
  auto it = r.ops.find(name);
  return it == r.ops.end() ? nullptr : it->second;
}

std::string custom_op_missing(const Attrs& attrs) {
  if (!attrs.has(kCustomOpKey)) return "the node names no custom op (attribute custom_op)";
  const std::string& name = attrs.str(kCustomOpKey);
  if (find_custom_op(name)) return {};
  const std::string lib = attrs.str(kCustomLibraryKey, "");
  return lib.empty()
             ? fmt::format("custom op '{}' is not registered (register it before use)", name)
             : fmt::format(
                   "custom op '{}' is not registered: load its op library '{}' first "
                   "(kiln::load_op_library)",
                   name, lib);
}

std::shared_ptr<const CustomOpEntry> custom_op_of(const Attrs& attrs) {
  if (std::string why = custom_op_missing(attrs); !why.empty())
    fail<UnsupportedError>("[custom] {}", why);
  return find_custom_op(attrs.str(kCustomOpKey));
}

bool node_has_kernel(const Node& n, Backend backend) {
  if (!is_custom(n.op)) return true;
  const auto e = find_custom_op(n.attrs.str(kCustomOpKey, ""));
  return e && e->kernels[static_cast<int>(backend)];
}

// Called from the CPU and CUDA kernel registrations (src/backends/*/custom_op.cpp).
void register_custom_dispatch(Backend backend) {
  KernelEntry e;
  e.fn = backend == Backend::cpu ? dispatch_kernel<Backend::cpu> : dispatch_kernel<Backend::cuda>;
  e.dtypes = kAllTypes;  // the op's own definition checks dtypes
  e.half_via_f32 = false;
  register_kernel(OpId::Custom, backend, e);
  register_kernel(OpId::CustomImpure, backend, e);
}

}  // namespace detail

// ---- op libraries

namespace {

class CollectingRegistrar final : public OpLibraryRegistrar {
 public:
  explicit CollectingRegistrar(std::string library) : library_(std::move(library)) {}
  void register_op(CustomOpDef def) override {
    check_def(def);
    def.library = library_;
    auto e = std::make_shared<CustomOpEntry>();
    e->def = std::move(def);
    entries.push_back(std::move(e));
  }
  void register_kernel(const std::string& op, Backend backend, CustomKernel kernel) override {
    for (auto& e : entries)
      if (e->def.name == op) {
        e->kernels[static_cast<int>(backend)] = std::move(kernel);
        return;
      }
    fail<ValueError>("[load_op_library] '{}' registers a {} kernel for '{}' before the op",
                     library_, backend_name(backend), op);
  }
  std::vector<std::shared_ptr<CustomOpEntry>> entries;

 private:
  std::string library_;
};

// The object holding kiln's code (libkiln, or the Python module kiln is linked into) put in the
// process's global scope, where an op library's references to kiln resolve (it links no kiln of
// its own). The Python module is loaded without RTLD_GLOBAL, so that the protobuf and ONNX
// libraries it links do not take the place of the onnx package's own copies in other modules;
// it goes global only when an op library needs it.
void make_kiln_global() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&load_op_library), &info) || !info.dli_fname) return;
  if (void* self = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL)) dlclose(self);
}

}  // namespace

void load_op_library(const std::string& path) {
  static std::mutex mu;
  static std::set<void*> loaded;
  std::lock_guard lock(mu);
  make_kiln_global();
  // RTLD_GLOBAL: a library may use ops of libraries loaded before it
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    const char* err = dlerror();
    fail<IoError>("[load_op_library] cannot load '{}': {}", path, err ? err : "unknown error");
  }
  if (loaded.count(h)) return;
  using VersionFn = int (*)();
  using RegisterFn = void (*)(OpLibraryRegistrar&);
  auto version = reinterpret_cast<VersionFn>(dlsym(h, "kiln_op_abi_version"));
  auto reg = reinterpret_cast<RegisterFn>(dlsym(h, "kiln_register_ops"));
  if (!version || !reg) {
    dlclose(h);
    fail<UnsupportedError>(
        "[load_op_library] '{}' is not a kiln op library: it does not export "
        "kiln_op_abi_version and kiln_register_ops (define them with "
        "KILN_OP_LIBRARY)",
        path);
  }
  if (const int v = version(); v != KILN_OP_ABI_VERSION) {
    dlclose(h);
    fail<UnsupportedError>(
        "[load_op_library] '{}' was built for op ABI version {}, but this kiln "
        "takes version {}: rebuild the library against this kiln's headers",
        path, v, KILN_OP_ABI_VERSION);
  }
  const std::string file = std::filesystem::path(path).filename().string();
  CollectingRegistrar r(file);
  reg(r);  // throws through: nothing is registered then
  insert_all(std::move(r.entries), fmt::format("load_op_library '{}'", file));
  loaded.insert(h);  // never closed: its kernels may run for the life of the process
}

}  // namespace kiln
