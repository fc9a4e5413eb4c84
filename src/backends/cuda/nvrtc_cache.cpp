// Generated CUDA kernels: NVRTC compilation, the binaries' and modules' caches, launches
// (nvrtc_cache.h).
#include "backends/cuda/nvrtc_cache.h"

#include <cuda_runtime.h>
#include <nvrtc.h>
#include <xxhash.h>

#include <atomic>
#include <map>
#include <mutex>
#include <type_traits>

#include "backends/cuda/cuda_check.h"
#include "core/errors.h"

namespace kiln::cuda::nvrtc {

namespace {
// Driver API entry points through the runtime (cudaGetDriverEntryPointByVersion), so libkiln does
// not link libcuda, which machines without a GPU driver lack.
struct Driver {
  CUresult (*get_error_string)(CUresult, const char**) = nullptr;
  CUresult (*stream_get_ctx)(CUstream, CUcontext*) = nullptr;
  CUresult (*ctx_get_current)(CUcontext*) = nullptr;
  CUresult (*ctx_push_current)(CUcontext) = nullptr;
  CUresult (*ctx_pop_current)(CUcontext*) = nullptr;
  CUresult (*module_load_data)(CUmodule*, const void*) = nullptr;
  CUresult (*module_unload)(CUmodule) = nullptr;
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*launch_kernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            unsigned, CUstream, void**, void**) = nullptr;
};
const Driver& driver() {
  static const Driver d = [] {
    Driver r;
    auto get = [](const char* sym, auto& fn) {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult q{};
      const cudaError_t e = cudaGetDriverEntryPointByVersion(sym, &p, 12000, cudaEnableDefault, &q);
      if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !p)
        fail<DeviceError>("[fused_elementwise] the CUDA driver has no entry point {} ({})", sym,
                          e != cudaSuccess ? cudaGetErrorString(e) : "symbol not found");
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    get("cuGetErrorString", r.get_error_string);
    get("cuStreamGetCtx", r.stream_get_ctx);
    get("cuCtxGetCurrent", r.ctx_get_current);
    get("cuCtxPushCurrent", r.ctx_push_current);
    get("cuCtxPopCurrent", r.ctx_pop_current);
    get("cuModuleLoadData", r.module_load_data);
    get("cuModuleUnload", r.module_unload);
    get("cuModuleGetFunction", r.module_get_function);
    get("cuLaunchKernel", r.launch_kernel);
    return r;
  }();
  return d;
}

[[noreturn]] void driver_fail(CUresult r, const char* expr) {
  const char* msg = nullptr;
  driver().get_error_string(r, &msg);
  fail<DeviceError>("[fused_elementwise] {} failed: {}", expr,
                    msg ? msg : "unknown CUDA driver error");
}
#define KILN_CU_CHECK(expr)                                     \
  do {                                                          \
    const CUresult kiln_cu_ = (expr);                           \
    if (kiln_cu_ != CUDA_SUCCESS) driver_fail(kiln_cu_, #expr); \
  } while (0)

[[noreturn]] void nvrtc_fail(nvrtcResult r, const char* expr, const std::string& log = {}) {
  fail<DeviceError>("[fused_elementwise] {} failed: {}{}{}", expr, nvrtcGetErrorString(r),
                    log.empty() ? "" : "; compiler log:\n", log);
}
#define KILN_NVRTC_CHECK(expr)                                  \
  do {                                                          \
    const nvrtcResult kiln_nv_ = (expr);                        \
    if (kiln_nv_ != NVRTC_SUCCESS) nvrtc_fail(kiln_nv_, #expr); \
  } while (0)

}  // namespace

std::vector<char> compile_cubin(const std::string& src, int arch) {
  nvrtcProgram prog;
  KILN_NVRTC_CHECK(nvrtcCreateProgram(&prog, src.c_str(), "kiln_fused.cu", 0, nullptr, nullptr));
  std::unique_ptr<nvrtcProgram, void (*)(nvrtcProgram*)> guard(
      &prog, [](nvrtcProgram* p) { nvrtcDestroyProgram(p); });
  const std::string arch_opt = fmt::format("--gpu-architecture=sm_{}", arch);
  const char* opts[] = {arch_opt.c_str(), "--std=c++17"};
  const nvrtcResult r = nvrtcCompileProgram(prog, 2, opts);
  if (r != NVRTC_SUCCESS) {
    size_t n = 0;
    std::string log;
    if (nvrtcGetProgramLogSize(prog, &n) == NVRTC_SUCCESS && n > 1) {
      log.resize(n);
      if (nvrtcGetProgramLog(prog, log.data()) != NVRTC_SUCCESS) log.clear();
      while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
    }
    nvrtc_fail(r, "nvrtcCompileProgram", log);
  }
  size_t size = 0;
  KILN_NVRTC_CHECK(nvrtcGetCUBINSize(prog, &size));
  std::vector<char> cubin(size);
  KILN_NVRTC_CHECK(nvrtcGetCUBIN(prog, cubin.data()));
  return cubin;
}

namespace {
// Compiled kernels by (context, hash of source and architecture); each compiles once.
struct Entry {
  std::mutex mu;
  CUmodule module = nullptr;
  CUfunction fn = nullptr;
};
std::mutex& cache_mu() {
  static std::mutex m;
  return m;
}
std::map<std::pair<CUcontext, uint64_t>, std::shared_ptr<Entry>>& cache() {
  // modules live until the process ends (contexts outlive executables)
  static auto* c = new std::map<std::pair<CUcontext, uint64_t>, std::shared_ptr<Entry>>();
  return *c;
}

// Binaries by key (XXH3-64 of the source and architecture): compiled here or imported from a
// package; a context without the module loads it from here instead of compiling.
std::map<uint64_t, std::shared_ptr<const std::vector<char>>>& binaries() {
  static auto* b = new std::map<uint64_t, std::shared_ptr<const std::vector<char>>>();
  return *b;
}
std::atomic<int64_t> compiled_count{0};
}  // namespace

uint64_t kernel_key(const std::string& src, int arch) {
  const std::string keyed = src + "\n// sm_" + std::to_string(arch);
  return XXH3_64bits(keyed.data(), keyed.size());
}

std::shared_ptr<const std::vector<char>> binary_for(const std::string& src, int arch,
                                                    uint64_t key) {
  {
    std::lock_guard<std::mutex> l(cache_mu());
    if (auto it = binaries().find(key); it != binaries().end()) return it->second;
  }
  auto bin = std::make_shared<const std::vector<char>>(compile_cubin(src, arch));
  ++compiled_count;
  std::lock_guard<std::mutex> l(cache_mu());
  return binaries().emplace(key, bin).first->second;  // the first one stored wins
}

int device_arch(int device) {
  int major = 0, minor = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor;
}

CUfunction get_kernel(const std::string& src, int device, CUstream stream) {
  CUcontext cu_ctx = nullptr;
  if (stream) KILN_CU_CHECK(driver().stream_get_ctx(stream, &cu_ctx));
  else KILN_CU_CHECK(driver().ctx_get_current(&cu_ctx));
  if (!cu_ctx) fail<DeviceError>("[fused_elementwise] no CUDA context on device {}", device);
  const int arch = device_arch(device);
  const uint64_t h = kernel_key(src, arch);
  std::shared_ptr<Entry> e;
  {
    std::lock_guard<std::mutex> l(cache_mu());
    auto& slot = cache()[{cu_ctx, h}];
    if (!slot) slot = std::make_shared<Entry>();
    e = slot;
  }
  std::lock_guard<std::mutex> l(e->mu);
  if (e->fn) return e->fn;
  auto load = [&](const std::vector<char>& cubin, CUmodule* mod, CUfunction* fn) {
    KILN_CU_CHECK(driver().ctx_push_current(cu_ctx));
    CUresult r = driver().module_load_data(mod, cubin.data());
    if (r == CUDA_SUCCESS) r = driver().module_get_function(fn, *mod, "kiln_fused");
    CUcontext popped;
    driver().ctx_pop_current(&popped);
    if (r != CUDA_SUCCESS && *mod) driver().module_unload(*mod), *mod = nullptr;
    return r;
  };
  CUmodule mod = nullptr;
  CUfunction fn = nullptr;
  CUresult r = load(*binary_for(src, arch, h), &mod, &fn);
  if (r != CUDA_SUCCESS) {
    // an imported binary the driver rejects: compile the source afresh
    auto fresh = std::make_shared<const std::vector<char>>(compile_cubin(src, arch));
    ++compiled_count;
    {
      std::lock_guard<std::mutex> g(cache_mu());
      binaries()[h] = fresh;
    }
    r = load(*fresh, &mod, &fn);
    if (r != CUDA_SUCCESS) driver_fail(r, "cuModuleLoadData / cuModuleGetFunction");
  }
  e->module = mod;
  e->fn = fn;
  return fn;
}

bool has_binary(uint64_t key) {
  std::lock_guard<std::mutex> l(cache_mu());
  return binaries().count(key) > 0;
}

bool add_binary(uint64_t key, const std::vector<char>& bytes) {
  std::lock_guard<std::mutex> l(cache_mu());
  return binaries().emplace(key, std::make_shared<const std::vector<char>>(bytes)).second;
}

void launch(CUfunction fn, int64_t blocks, int threads, CUstream stream, void** args) {
  KILN_CU_CHECK(driver().launch_kernel(fn, static_cast<unsigned>(blocks), 1, 1,
                                       static_cast<unsigned>(threads), 1, 1, 0, stream, args,
                                       nullptr));
}

void forget() {
  std::lock_guard<std::mutex> l(cache_mu());
  for (auto& [k, e] : cache()) {
    if (!e->module) continue;
    if (driver().ctx_push_current(k.first) != CUDA_SUCCESS) continue;
    driver().module_unload(e->module);
    CUcontext popped;
    driver().ctx_pop_current(&popped);
  }
  cache().clear();
  binaries().clear();
}

int64_t compiled() { return compiled_count.load(); }

}  // namespace kiln::cuda::nvrtc
