// Executable: a compiled, shape-specialized plan for one device.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/array.h"
#include "kiln/graph.h"

namespace kiln {

namespace detail {
struct ExecutableImpl;
}

class Executable {
 public:
  Executable();
  ~Executable();
  Executable(Executable&&) noexcept;
  Executable& operator=(Executable&&) noexcept;
  explicit Executable(std::shared_ptr<detail::ExecutableImpl> impl);

  /// Runs with the given placeholder values; returns the targets in order.
  /// Throws ShapeError / DTypeError naming the placeholder when a feed does not match.
  std::vector<Array> run(const Feeds& feeds) const;
  /// Same, with placeholders named by their names.
  std::vector<Array> run(const std::map<std::string, Array>& feeds) const;

  Device device() const;
  /// Bytes of the intermediate-buffer arena (peak intermediate memory of one run).
  size_t peak_intermediate_bytes() const;
  /// Number of kernels one run executes.
  size_t num_steps() const;
  /// Names of the placeholders the executable reads, with their compiled shapes and dtypes.
  struct IoInfo {
    std::string name;
    Shape shape;
    DType dtype;
  };
  std::vector<IoInfo> inputs() const;
  std::vector<IoInfo> outputs() const;
  /// Where each kernel of a run executes; `fallback_reason` says why a step of a GPU executable
  /// runs on the CPU (its inputs and outputs are then copied between host and device).
  struct StepInfo {
    int node = -1;
    std::string op;
    std::string backend;  // "cpu" or "cuda"
    std::string fallback_reason;
  };
  std::vector<StepInfo> placement() const;
  /// A readable report: the device, kernels per backend, and every CPU fallback with its reason.
  std::string report() const;
  /// A readable listing of the optimized program and its memory plan.
  std::string dump() const;

  const detail::ExecutableImpl& impl() const { return *impl_; }

 private:
  std::shared_ptr<detail::ExecutableImpl> impl_;
};

}  // namespace kiln
