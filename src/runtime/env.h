// Every environment variable kiln reads, in one place: the table in env_vars.inc names and
// documents each, get() is the library's one getenv, and the accessors below parse them.
#pragma once

#include "kiln/kernel_choices.h"

namespace kiln::env {

enum class Var {
#define KILN_ENV_VAR(name, doc) name,
#include "runtime/env_vars.inc"
#undef KILN_ENV_VAR
};

/// The variable's name ("KILN_LOG").
const char* name(Var v);
/// Its value, or nullptr when it is unset or empty.
const char* get(Var v);

/// KILN_DEVICE or nullptr.
const char* device();
/// KILN_LOG or nullptr.
const char* log_level();
/// KILN_THREADS parsed, or 0.
int threads();
/// Whether KILN_VALIDATE=cpu (read once).
bool validate_on_cpu();
/// Whether KILN_STEP_TIMES is set (read once).
bool step_times();
/// Whether KILN_STEP_TIMES=device (read once).
bool step_times_device();
/// KILN_CAPTURE: 0 or 1, or -1 when unset (read at every compile).
int capture();
/// False when KILN_CONDITIONAL_NODES=0 (read at every compile).
bool conditional_nodes();
/// KILN_LOOP_UNROLL: the most steps a recorded loop runs per body launch (0: unset).
int loop_unroll();
/// False when KILN_FUSION=0 (read once).
bool fusion_enabled();
/// False when KILN_FUSE_GROUPS=0 (read at every compile).
bool fuse_groups();
/// True when KILN_CUDNN_RUNTIME_FUSION=1 (read when a convolution problem is first seen).
bool cudnn_runtime_fusion();
/// False when KILN_GEMM_BORROW=0 (read when an executable of many shapes plans a new cuBLASLt
/// product).
bool gemm_borrow();
/// True when KILN_DETERMINISTIC=1 (read at every compile and run).
bool deterministic();
/// Sets the fields of `c` whose variables are set (KILN_CHANNELS_LAST, KILN_CUDNN_GRAPH,
/// KILN_RNN_PERSISTENT, KILN_QCONV_IGEMM, KILN_PDL, KILN_ATTENTION_F32_TILES); read when an
/// executable is compiled or loaded.
void override_kernel_choices(KernelChoices& c);

}  // namespace kiln::env
