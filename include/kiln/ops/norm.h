// Softmax, normalization layers and dropout.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kiln/graph.h"

namespace kiln {

/// exp(x) / sum(exp(x)) along `axis` (float dtypes).
Tensor softmax(const Tensor& x, int64_t axis = -1);
/// log(softmax(x)) along `axis` (float dtypes).
Tensor log_softmax(const Tensor& x, int64_t axis = -1);
/// Normalizes over dims [begin_axis, rank); weight and bias have those dims' shape.
Tensor layer_norm(const Tensor& x, const std::optional<Tensor>& weight = std::nullopt,
                  const std::optional<Tensor>& bias = std::nullopt, int64_t begin_axis = -1,
                  double eps = 1e-5);
/// x / sqrt(mean(x²) + eps) * weight, the mean over dims [begin_axis, rank); weight has those
/// dims' shape.
Tensor rms_norm(const Tensor& x, const std::optional<Tensor>& weight = std::nullopt,
                int64_t begin_axis = -1, double eps = 1e-6);
/// Inference batch norm over channel axis 1 with running mean and var of shape (C).
Tensor batch_norm(const Tensor& x, const Tensor& mean, const Tensor& var,
                  const std::optional<Tensor>& weight = std::nullopt,
                  const std::optional<Tensor>& bias = std::nullopt, double eps = 1e-5);
/// The result of batch_norm_training: y and the assigns to the running statistics.
struct BatchNormTraining {
  Tensor y;
  std::vector<Tensor> updates;
};
/// Batch norm in training mode: normalizes with the batch's own mean and (biased) variance over
/// every axis but 1, and returns the assigns that move the running statistics (variables of shape
/// (C)) towards the batch's: new = (1 - momentum) * old + momentum * batch, with the unbiased
/// variance for running_var (PyTorch's convention). Returns (y, updates); pass `updates` to
/// compile as updates.
BatchNormTraining batch_norm_training(const Tensor& x, const Tensor& running_mean,
                                      const Tensor& running_var,
                                      const std::optional<Tensor>& weight = std::nullopt,
                                      const std::optional<Tensor>& bias = std::nullopt,
                                      double momentum = 0.1, double eps = 1e-5);
/// The result of batch_norm_train: y and the batch's mean and biased var.
struct BatchNormTrainResult {
  Tensor y, mean, var;
};
/// The fused training batch norm that batch_norm_training builds: y normalized with the batch's
/// own statistics over every axis but 1, and those statistics, mean and biased var of shape (C),
/// all in x's dtype (the kernels compute in f32 for half types, f64 for f64). Returns
/// (y, mean, var).
BatchNormTrainResult batch_norm_train(const Tensor& x,
                                      const std::optional<Tensor>& weight = std::nullopt,
                                      const std::optional<Tensor>& bias = std::nullopt,
                                      double eps = 1e-5);
/// The result of batch_norm_train_grad: the gradients of x, the weight and the bias.
struct BatchNormTrainGradResult {
  Tensor dx, dweight, dbias;
};
/// The backward of batch_norm_train for y's gradient dy, from x and the batch's mean and var:
/// with xhat = (x - mean) * rstd and M values per channel, dbias = sum(dy),
/// dweight = sum(dy * xhat), dx = w * rstd / M * (M * dy - dbias - xhat * dweight) (w = 1 without
/// a weight). Returns (dx, dweight, dbias); dweight and dbias (C) are always computed.
BatchNormTrainGradResult batch_norm_train_grad(const Tensor& dy, const Tensor& x,
                                               const Tensor& mean, const Tensor& var,
                                               const std::optional<Tensor>& weight = std::nullopt,
                                               double eps = 1e-5);
/// Per (n, c) normalization over spatial dims; weight and bias of shape (C).
Tensor instance_norm(const Tensor& x, const std::optional<Tensor>& weight = std::nullopt,
                     const std::optional<Tensor>& bias = std::nullopt, double eps = 1e-5);
/// Normalization over groups of channels; weight and bias of shape (C).
Tensor group_norm(const Tensor& x, int64_t groups,
                  const std::optional<Tensor>& weight = std::nullopt,
                  const std::optional<Tensor>& bias = std::nullopt, double eps = 1e-5);
/// Identity unless `training`; then zeroes each element with probability p and scales the rest
/// by 1/(1-p), drawing from `seed` (the same seed gives the same mask).
Tensor dropout(const Tensor& x, double p, bool training = false, uint64_t seed = 0);

}  // namespace kiln
