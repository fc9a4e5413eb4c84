// The persistent recurrent kernels (rnn_persistent.cu), called by rnn.cu.
#pragma once

#include "backends/cuda/rnn_cells.cuh"
#include "kiln/kernel.h"

namespace kiln::cuda::rnn_detail {

/// Every forward step of direction g.d (f32 LSTM, or GRU with linear_before_reset) in one
/// cooperative launch: h (B x H, h0 in, the last h out) and c (LSTM, likewise), y and the reserve
/// res as the per-step kernels leave them. False, with nothing enqueued, where it cannot run
/// (KILN_RNN_PERSISTENT=0, another cell, H not a multiple of 4, shared memory, co-residency).
bool rnn_persistent(KernelContext& ctx, const Geo& g, const int64_t* lens, const float* xw,
                    const float* R, const float* P, const float* rbh, float* h, float* c, float* y,
                    float* res);

/// Every backward step of direction g.d in one cooperative launch (no peepholes): dh and dc
/// (B x H: dhn and dcn in, dh0 and dc0 out), dg, dgr_all (GRU; null for an LSTM) and hp_all
/// filled as the per-step loop fills them, dgr its scratch. False, with nothing enqueued, where
/// it cannot run.
bool rnn_backward_persistent(KernelContext& ctx, const Geo& g, const int64_t* lens,
                             const float* res, const float* dy, const float* h0, const float* c0,
                             const float* R, const float* P, float* dh, float* dc, float* dg,
                             float* dgr, float* dgr_all, float* hp_all);

}  // namespace kiln::cuda::rnn_detail
