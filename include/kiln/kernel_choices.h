// Which of two exact kernels runs where a backend has both: CompileOptions::kernels.
#pragma once

namespace kiln {

/// Kernel choices an executable is compiled with, for comparing two kernels and for working
/// around one. Each default is the faster choice measured on the H200 (bench/RESULTS.md). The
/// environment variable named with a field, when set, overrides it for every executable compiled
/// or loaded in the process. A package keeps what channels_last did to its program; the other
/// choices of a loaded executable are the defaults and the environment's.
struct KernelChoices {
  /// The channels_last pass: int8 convolutions, CUDA's f16/bf16 (and TF32) inference
  /// convolutions and the CPU's f32 inference convolutions run on NHWC data with their weights
  /// permuted once at compile time. KILN_CHANNELS_LAST=0 turns it off.
  bool channels_last = true;
  /// CUDA f16/bf16 NHWC convolutions time cuDNN's graph-API plans against its legacy algorithm on
  /// a problem's first run and keep the fastest; off, the legacy algorithm only.
  /// KILN_CUDNN_GRAPH=0 turns it off.
  bool cudnn_graph = true;
  /// CUDA f32 LSTM and GRU layers run each direction's forward pass as one persistent kernel
  /// (instead of launches per step). KILN_RNN_PERSISTENT sets both passes: forward (the
  /// default), backward, 1 (both) or 0 (neither).
  bool rnn_persistent_forward = true;
  /// Likewise for the backward pass (on the H200 still slower than the per-step kernels).
  bool rnn_persistent_backward = false;
  /// CUDA NHWC int8 convolutions (C a multiple of 64, symmetric weights) and quantized_matmul run
  /// on the implicit-GEMM kernel that fuses the requantize; off, im2col + cuBLASLt's int8 GEMM and
  /// an exact epilogue (within 1 LSB). KILN_QCONV_IGEMM=0 turns it off.
  bool qconv_implicit_gemm = true;
  /// That kernel launches with a programmatic dependency on the kernel before it (Hopper;
  /// measured slower). KILN_PDL=1 turns it on.
  bool programmatic_launch = false;
  /// CUDA f32 attention with head dims 32, 64 and 128 runs on register tiles; off, on the
  /// warp-per-row kernel. KILN_ATTENTION_F32_TILES=0 turns it off.
  bool attention_f32_tiles = true;
};

}  // namespace kiln
