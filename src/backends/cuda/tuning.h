// The CUDA backend's tuning decisions (src/core/tuning.h): the cuDNN convolution algorithm of each
// problem, chosen on its first run (conv_algo.cu) and kept for the process.
//
// Records (kinds 0-3; other kinds are reserved for later decisions and skipped by this reader):
//   kind   the pass: 0 forward (Conv), 1 backward data (ConvTranspose), 2 backward filter
//          (ConvGradWeight)
//   key    24 values: dtype (kiln::DType), nd (2 or 3), N, C, O, groups, then input sizes,
//          kernel sizes, output sizes, pads, strides and dilations, 3 each (1-D and 2-D problems
//          padded in front with 1, pads with 0): the problem as cuDNN sees it
//   value  3 values: algorithm (cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t), math type
//          (cudnnMathType_t), workspace bytes
// Kind 3: how an f16/bf16 channels_last forward convolution runs (conv_nhwc.cu's nhwc_plan)
//   key    the forward key above (nd 10 marks NHWC 2-D) and 3 flags: bias, residual, relu
//   value  -1, 0, 0 for cuDNN's legacy algorithm (then the kind-0 record holds it); else a
//          graph-API plan: cuDNN's engine index, 1 when the plan computes the epilogue, workspace
//          bytes, then each knob choice as type << 48 | value (value as 48-bit two's complement)
// A kind-3 plan cuDNN no longer takes is timed again as if there were no record.
// A seeded record is checked like a choice of the backend's own (the algorithm within cuDNN's
// enum, exact algorithms for f64, FMA math for f32, workspace at most 1 GiB), and its workspace
// is asked of cuDNN again on the first run; an algorithm cuDNN refuses for the problem is
// measured as if there were no record.
#pragma once

#include <string>
#include <vector>

#include "core/device_backend.h"

namespace kiln::cuda {

/// GPU name, "sm_<major><minor>" and "cudnn <cudnnGetVersion()>" of `device`.
TuningIdentity conv_tuning_identity(int device);
/// The algorithms chosen so far on `device` for the convolutions of `calls`.
std::vector<TuningRecord> export_conv_tuning(int device, const std::vector<KernelCall>& calls);
/// Seeds `device`'s choices (DeviceBackend::import_tuning).
std::string import_conv_tuning(int device, const std::vector<TuningRecord>& records,
                               size_t* seeded);
TuningStats conv_tuning_stats();
/// Forgets every choice and seed; not while runs are in flight.
void clear_conv_tuning();

}  // namespace kiln::cuda
