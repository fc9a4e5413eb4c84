// Counts the GPU kernels a process launches, by symbol, for the GPU suite's variant coverage
// (scripts/kernel_coverage.py). A CUDA injection library: the driver loads it into any CUDA
// program named by CUDA_INJECTION64_PATH and calls InitializeInjection, which subscribes to the
// runtime's and the driver's launch callbacks through CUPTI. Launches recorded into a CUDA graph
// count when they are recorded (a replay launches no kernel by symbol). At exit the counts go to
// KILN_KERNEL_COUNTS/<pid>.tsv, one "count<TAB>mangled symbol" line per kernel.
//
//   CUDA_INJECTION64_PATH=build-gpu/libkiln_kernel_counter.so KILN_KERNEL_COUNTS=counts/ prog
#include <cupti.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

namespace {

std::mutex mu;
std::unordered_map<std::string, long long>* counts = nullptr;
thread_local int runtime_depth = 0;  // a runtime launch calls the driver: count it once

bool is_kernel_launch(CUpti_CallbackDomain domain, CUpti_CallbackId id) {
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) switch (id) {
      case CUPTI_RUNTIME_TRACE_CBID_cudaLaunch_v3020:
      case CUPTI_RUNTIME_TRACE_CBID_cudaLaunch_ptsz_v7000:
      case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000:
      case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000:
      case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000:
      case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_ptsz_v9000:
      case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060:
      case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060:
        return true;
      default:
        return false;
    }
  switch (id) {
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz:
      return true;
    default:
      return false;
  }
}

void CUPTIAPI on_api(void*, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void* data) {
  if (!is_kernel_launch(domain, id)) return;
  const auto* cb = static_cast<const CUpti_CallbackData*>(data);
  const bool runtime = domain == CUPTI_CB_DOMAIN_RUNTIME_API;
  if (cb->callbackSite == CUPTI_API_EXIT) {
    if (runtime) --runtime_depth;
    return;
  }
  if (runtime) ++runtime_depth;
  if (!runtime && runtime_depth > 0) return;
  const char* name = cb->symbolName ? cb->symbolName : "(unnamed)";
  std::lock_guard<std::mutex> l(mu);
  ++(*counts)[name];
}

void write_counts() {
  const char* dir = std::getenv("KILN_KERNEL_COUNTS");
  if (!dir || !*dir) return;
  const std::string path = std::string(dir) + "/" + std::to_string(::getpid()) + ".tsv";
  std::lock_guard<std::mutex> l(mu);
  if (FILE* f = std::fopen(path.c_str(), "w")) {
    for (const auto& [name, n] : *counts) std::fprintf(f, "%lld\t%s\n", n, name.c_str());
    std::fclose(f);
  } else {
    std::fprintf(stderr, "[kernel_counter] cannot write %s\n", path.c_str());
  }
}

bool check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return true;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "[kernel_counter] %s failed: %s\n", what, msg ? msg : "?");
  return false;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjection() {
  counts = new std::unordered_map<std::string, long long>();  // outlives every static
  CUpti_SubscriberHandle sub;
  if (!check(cuptiSubscribe(&sub, on_api, nullptr), "cuptiSubscribe") ||
      !check(cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API), "runtime callbacks") ||
      !check(cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_DRIVER_API), "driver callbacks"))
    return 0;
  std::atexit(write_counts);
  return 1;
}
