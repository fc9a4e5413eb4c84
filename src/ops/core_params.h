// The core family's attributes (src/ops/core.cpp documents them) decoded once into the structs
// its kernels read. (C++17: CUDA files include it.)
#pragma once

#include <string>

#include "core/op_id.h"
#include "core/op_params.h"

namespace kiln {

/// full: the value every element takes (converted to the output's dtype by the kernel).
struct FullParams : OpParams {
  double value = 0;

  static FullParams decode(OpId, const Attrs& a) {
    FullParams p;
    p.value = a.f("value");
    return p;
  }
};

/// arange: element i is start + i * step (stop only sets the length, from the output's shape).
struct ArangeParams : OpParams {
  double start = 0, step = 1;

  static ArangeParams decode(OpId, const Attrs& a) {
    ArangeParams p;
    p.start = a.f("start");
    p.step = a.f("step");
    return p;
  }
};

/// assign_slice: the error a start out of range gives (CPU kernel, and the runtime for a GPU
/// kernel's report): names the variable, its shape, the update's and the start.
std::string assign_slice_range_error(const std::string& variable, const Shape& var_shape,
                                     const Shape& update, int64_t dim, int64_t start);

}  // namespace kiln
