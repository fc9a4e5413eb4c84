// Every environment variable kiln reads, in one place.
//   KILN_DEVICE   default device: cpu, cuda, cuda:N
//   KILN_LOG      log level: error (default), warn, info, debug
//   KILN_THREADS  threads of the CPU kernel pool (default: one per core)
//   KILN_VALIDATE "cpu": GPU runs re-run every kernel on the CPU and stop at the first op whose
//                 results disagree
//   KILN_STEP_TIMES  diagnostics: GPU runs synchronize after every kernel and the executable
//                 prints the time per op (host and device together) to stderr when destroyed
//   KILN_FUSION   "0": compiling never fuses elementwise chains (CompileOptions::fuse_elementwise)
//   KILN_TEST_SEED  tests only: replays the random inputs of an earlier test run
#pragma once

namespace kiln::env {

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
/// False when KILN_FUSION=0 (read once).
bool fusion_enabled();

}  // namespace kiln::env
