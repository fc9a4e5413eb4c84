// allow_tf32 (CompileOptions::allow_tf32): marks the f32 products and convolutions that CUDA may
// run on TF32 tensor cores with attr tf32; the CUDA kernels pick their math by it (cuBLASLt's
// CUBLAS_COMPUTE_32F_FAST_TF32, cuDNN's default math instead of FMA-only), the CPU's ignore it.
#include "core/graph_impl.h"
#include "core/op_registry.h"
#include "passes/program.h"

namespace kiln {

Program allow_tf32(const Program& p) {
  Program out = p;
  for (detail::Node& n : out.graph.nodes) {
    if (!op_def(n.op).tensor_core) continue;
    bool f32_inputs = !n.inputs.empty();
    for (const detail::ValueRef v : n.inputs)
      f32_inputs = f32_inputs && out.graph.info(v).dtype == f32;
    if (f32_inputs) n.attrs.set("tf32", true);
  }
  return out;
}

}  // namespace kiln
