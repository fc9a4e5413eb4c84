// Packages with a tuning section, made without a GPU: a CPU executable saved while a stand-in
// backend answers the tuning calls (identity and records as given).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/device_backend.h"
#include "core/tuning.h"
#include "kiln/executable.h"
#include "runtime/executable_impl.h"

namespace kiln::test {

class TuningOnlyBackend final : public DeviceBackend {
 public:
  TuningOnlyBackend(TuningIdentity identity, std::vector<TuningRecord> records)
      : identity_(std::move(identity)), records_(std::move(records)) {}
  void* allocate(int, size_t, void*) override { throw Error("[test] tuning only"); }
  void release(int, void*) override {}
  void copy_async(int, void*, bool, const void*, bool, size_t, void*) override {
    throw Error("[test] tuning only");
  }
  void memset_async(int, void*, int, size_t, void*) override { throw Error("[test] tuning only"); }
  void* create_stream(int) override { throw Error("[test] tuning only"); }
  void destroy_stream(int, void*) override {}
  void synchronize(int, void*) override {}
  KernelEnv kernel_env(int, void*) override { throw Error("[test] tuning only"); }
  void* allocate_mapped(size_t) override { throw Error("[test] tuning only"); }
  void release_mapped(void*) override {}
  void memory_info(int, size_t*, size_t*) override {}
  TuningIdentity tuning_identity(int) override { return identity_; }
  std::vector<TuningRecord> export_tuning(int, const std::vector<KernelCall>&) override {
    return records_;
  }

 private:
  TuningIdentity identity_;
  std::vector<TuningRecord> records_;
};

/// The bytes of `exe` (a CPU executable that has not run) saved with a tuning section.
inline std::vector<uint8_t> save_with_tuning(const Executable& exe, const TuningIdentity& identity,
                                             const std::vector<TuningRecord>& records) {
  static std::atomic<int> n{0};
  TuningOnlyBackend backend(identity, records);
  auto& impl = const_cast<detail::ExecutableImpl&>(exe.impl());
  impl.backend = &backend;  // only save reads it
  const std::string path = testing::TempDir() + "kiln_pkg_tuned_" + std::to_string(::getpid()) +
                           "_" + std::to_string(n++) + ".kiln";
  try {
    exe.save(path);
  } catch (...) {
    impl.backend = nullptr;
    throw;
  }
  impl.backend = nullptr;
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> bytes(std::istreambuf_iterator<char>(in), {});
  std::filesystem::remove(path);
  return bytes;
}

/// A few convolution records as the CUDA backend writes them (kinds 0-2, 24 key and 3 value
/// entries).
inline std::vector<TuningRecord> sample_conv_records() {
  std::vector<TuningRecord> r;
  for (uint16_t pass = 0; pass < 3; ++pass) {
    TuningRecord t;
    t.kind = pass;
    t.key = {0, 2, 4, 3, 8, 1, 1, 16, 16, 1, 3, 3, 1, 16, 16, 0, 1, 1, 1, 1, 1, 1, 1, 1};
    t.value = {1, 3, int64_t{4096} * (pass + 1)};
    r.push_back(t);
  }
  return r;
}

inline TuningIdentity sample_identity() { return {"NVIDIA H200", "sm_90", "cudnn 90100"}; }

}  // namespace kiln::test
