// A kernel context lent the caller's views: moved in, and given back when the context ends. A
// context takes its views by value; copies would allocate every view's shape for every kernel
// (the step loop and fused programs run kernels by the thousand).
#pragma once

#include <utility>
#include <vector>

#include "kiln/kernel.h"

namespace kiln {

struct KernelContextViews {
  KernelContext ctx;
  std::vector<TensorView>& in;
  std::vector<TensorView>& out;
  KernelContextViews(OpId op, const Attrs& attrs, std::vector<TensorView>& in,
                     std::vector<TensorView>& out, ThreadPool* pool, const KernelEnv* env,
                     const OpParams* params)
      : ctx(op, attrs, std::move(in), std::move(out), pool, env, params), in(in), out(out) {}
  ~KernelContextViews() {
    in = std::move(ctx.inputs_);
    out = std::move(ctx.outputs_);
  }
  KernelContextViews(const KernelContextViews&) = delete;
  KernelContextViews& operator=(const KernelContextViews&) = delete;
};

}  // namespace kiln
