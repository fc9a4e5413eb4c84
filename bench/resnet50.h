// Shared by the benchmarks: deterministic data and ResNet-50 built with kiln's C++ API
// (torchvision's architecture: v1.5 bottlenecks, stride on the 3x3 conv).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/kiln.h"

namespace kiln_bench {
using namespace kiln;

// Deterministic uniform values with standard deviation `stddev` (fast enough for 25M weights).
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  float uniform() {  // in [-1, 1)
    s_ += 0x9E3779B97F4A7C15ull;
    uint64_t z = s_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<float>(z >> 40) / static_cast<float>(1 << 23) - 1.0f;
  }
  Array array(const Shape& s, float stddev, float mean = 0) {
    Array a = Array::empty(s, f32);
    float* p = a.data<float>();
    const float half_width = stddev * 1.7320508f;  // uniform on [-w, w] has stddev w/sqrt(3)
    for (int64_t i = 0; i < a.numel(); ++i) p[i] = mean + half_width * uniform();
    return a;
  }

 private:
  uint64_t s_;
};

inline Array labels(int64_t n, int64_t classes) {
  Array a = Array::empty({n}, i64);
  for (int64_t i = 0; i < n; ++i) a.data<int64_t>()[i] = (i * 7919) % classes;
  return a;
}

inline Array filled(const Shape& s, float v) {
  Array a = Array::empty(s, f32);
  std::fill(a.data<float>(), a.data<float>() + a.numel(), v);
  return a;
}

// ---- ResNet-50 (torchvision's architecture: v1.5 bottlenecks, stride on the 3x3 conv) ----

class ResNet50 {
 public:
  // Training graphs hold parameters as variables and use batch statistics; inference graphs hold
  // them as constants and use running statistics.
  // Inference graphs may hold everything in `dtype` (bf16: the whole model in bf16, as
  // PyTorch's model.to(torch.bfloat16)).
  ResNet50(Graph& g, bool training, uint64_t seed = 1, DType dtype = f32)
      : g_(g), training_(training), rng_(seed), dtype_(dtype) {}

  Tensor forward(const Tensor& x) {
    const int64_t n = x.dim(0);
    Tensor h = relu(bn(conv(x, 3, 64, 7, 2, 3, "conv1"), 64, "bn1"));
    PoolOptions pool;
    pool.kernel = {3, 3};
    pool.stride = {2, 2};
    pool.padding = {1, 1};
    h = max_pool(h, pool);
    int64_t cin = 64;
    const int64_t blocks[4] = {3, 4, 6, 3};
    for (int layer = 0; layer < 4; ++layer) {
      const int64_t width = int64_t{64} << layer;
      for (int64_t b = 0; b < blocks[layer]; ++b) {
        const int64_t stride = (layer > 0 && b == 0) ? 2 : 1;
        h = bottleneck(h, cin, width, stride, fmt::format("layer{}.{}", layer + 1, b));
        cin = width * 4;
      }
    }
    h = reshape(adaptive_avg_pool(h, {1, 1}), {n, 2048});
    const float bound = 1.0f / std::sqrt(2048.0f);
    Tensor w = param(rng_.array({1000, 2048}, bound / 1.7320508f), "fc.weight");
    Tensor b = param(rng_.array({1000}, bound / 1.7320508f), "fc.bias");
    return linear(h, w, b);
  }

  const std::vector<Tensor>& params() const { return params_; }
  const std::vector<Tensor>& bn_updates() const { return bn_updates_; }

 private:
  Tensor param(const Array& a, const std::string& name) {
    if (!training_) return g_.constant(a.astype(dtype_), name);
    Tensor v = g_.variable(a, name);
    params_.push_back(v);
    return v;
  }

  Tensor conv(const Tensor& x, int64_t cin, int64_t cout, int64_t k, int64_t stride, int64_t pad,
              const std::string& name) {
    // kaiming normal, fan_out, as torchvision initializes
    const float stddev = std::sqrt(2.0f / static_cast<float>(cout * k * k));
    Tensor w = param(rng_.array({cout, cin, k, k}, stddev), name + ".weight");
    ConvOptions o;
    o.stride = {stride, stride};
    o.padding = {pad, pad};
    return conv2d(x, w, std::nullopt, o);
  }

  Tensor bn(const Tensor& x, int64_t c, const std::string& name) {
    Tensor w = param(filled({c}, 1.0f), name + ".weight");
    Tensor b = param(filled({c}, 0.0f), name + ".bias");
    if (training_) {
      Tensor mean = g_.variable(filled({c}, 0.0f), name + ".running_mean");
      Tensor var = g_.variable(filled({c}, 1.0f), name + ".running_var");
      auto r = batch_norm_training(x, mean, var, w, b);
      bn_updates_.insert(bn_updates_.end(), r.updates.begin(), r.updates.end());
      return r.y;
    }
    Tensor mean = g_.constant(rng_.array({c}, 0.05f).astype(dtype_), name + ".running_mean");
    Tensor var = g_.constant(rng_.array({c}, 0.25f, 1.0f).astype(dtype_), name + ".running_var");
    return batch_norm(x, mean, var, w, b);
  }

  Tensor bottleneck(const Tensor& x, int64_t cin, int64_t width, int64_t stride,
                    const std::string& name) {
    const int64_t cout = width * 4;
    Tensor h = relu(bn(conv(x, cin, width, 1, 1, 0, name + ".conv1"), width, name + ".bn1"));
    h = relu(bn(conv(h, width, width, 3, stride, 1, name + ".conv2"), width, name + ".bn2"));
    h = bn(conv(h, width, cout, 1, 1, 0, name + ".conv3"), cout, name + ".bn3");
    Tensor identity = x;
    if (stride != 1 || cin != cout)
      identity = bn(conv(x, cin, cout, 1, stride, 0, name + ".downsample.0"), cout,
                    name + ".downsample.1");
    return relu(h + identity);
  }

  Graph& g_;
  bool training_;
  Rng rng_;
  DType dtype_;
  std::vector<Tensor> params_;
  std::vector<Tensor> bn_updates_;
};

}  // namespace kiln_bench
