// Every environment variable kiln reads, in one place.
//   KILN_DEVICE   default device: cpu, cuda, cuda:N
//   KILN_LOG      log level: error (default), warn, info, debug
//   KILN_THREADS  threads of the CPU kernel pool (default: one per core)
//   KILN_VALIDATE "cpu": GPU runs re-run every kernel on the CPU and stop at the first op whose
//                 results disagree
//   KILN_STEP_TIMES  diagnostics: the executable prints the time per op to stderr when destroyed
//                 (CPU runs: each step's wall time; GPU runs synchronize after every kernel,
//                 host and device time together);
//                 "device": CUDA events around every kernel instead, no synchronization, device
//                 time only, runs after the first on each stream (no algorithm measurements)
//   KILN_CAPTURE  "0": GPU runs are never recorded and replayed as CUDA graphs, whatever
//                 CompileOptions::capture says ("1": recorded whenever possible)
//   KILN_FUSION   "0": compiling never fuses elementwise chains (CompileOptions::fuse_elementwise)
//   KILN_CHANNELS_LAST  "0": compiling keeps convolutions NCHW (no channels_last pass)
//   KILN_CUDNN_GRAPH  "0": CUDA f16/bf16 channels_last convolutions use cuDNN's legacy algorithm
//                 API only (default: the graph API's plans are timed against it on a problem's
//                 first run and the fastest kept)
//   KILN_CUDNN_RUNTIME_FUSION  "1": the graph API may also offer engines that compile kernels
//                 at run time (slower first runs)
//   KILN_RNN_PERSISTENT  "0": CUDA f32 LSTM and GRU layers run launches per step instead of
//                 one persistent kernel per direction (forward and backward)
//   KILN_DETERMINISTIC  "1": every executable runs as with CompileOptions::deterministic
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
/// Whether KILN_STEP_TIMES=device (read once).
bool step_times_device();
/// KILN_CAPTURE: 0 or 1, or -1 when unset (read at every compile).
int capture();
/// False when KILN_FUSION=0 (read once).
bool fusion_enabled();
/// False when KILN_CHANNELS_LAST=0 (read at every compile): the channels_last pass is off.
bool channels_last();
/// False when KILN_CUDNN_GRAPH=0 (read at every f16/bf16 channels_last convolution run).
bool cudnn_graph();
/// True when KILN_CUDNN_RUNTIME_FUSION=1 (read when a convolution problem is first seen).
bool cudnn_runtime_fusion();
/// Whether the CUDA LSTM/GRU layers' forward (backward = false) or backward pass may run as one
/// persistent kernel: KILN_RNN_PERSISTENT=forward (the default: on the H200 the persistent
/// backward kernel is still slower than the per-step kernels) or =backward that pass only, =1
/// both, anything else neither (read at every CUDA LSTM/GRU layer run).
bool rnn_persistent(bool backward);
/// True when KILN_DETERMINISTIC=1 (read at every compile and run).
bool deterministic();

}  // namespace kiln::env
