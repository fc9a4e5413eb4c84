// Small float models for the post-training quantization tests: a ResNet-shaped CNN (bottleneck
// blocks with residual adds and batch norms, global pool, linear classifier) and a BERT-shaped
// encoder (attention projections, softmax, GELU feed-forward, layer norms), with random weights.
#pragma once

#include <cmath>
#include <random>

#include "support/reference.h"

namespace kiln::test {

inline Array normal_array(const Shape& s, double stddev, double mean = 0) {
  std::normal_distribution<double> d(mean, stddev);
  std::vector<float> v(static_cast<size_t>(numel(s)));
  for (float& x : v) x = static_cast<float>(d(rng()));
  return Array::from_vector(v, s);
}

/// A ResNet-shaped CNN that classifies images of kClasses kinds: each kind a random prototype
/// (per-channel offsets and a pixel pattern), each image a prototype plus noise. The classifier
/// is the nearest class centroid of the float trunk's features, so the float model is decisive,
/// as a trained one is.
struct SmallCnn {
  Graph g;
  Tensor x, features, logits;
  static constexpr int64_t kClasses = 10, kSize = 16, kFeatures = 256;

  SmallCnn() : prototypes_(prototypes()), sample_(images(16)) {
    x = g.placeholder({-1, 3, kSize, kSize}, f32, "images");
    Tensor h = relu(conv_bn(x, 3, 32, 3, 1, "stem"));
    h = bottleneck(h, 32, 32, 128, 1, "block1");
    h = bottleneck(h, 128, 96, 256, 2, "block2");
    h = bottleneck(h, 256, 96, kFeatures, 1, "block3");
    features = reshape(global_avg_pool(h), {-1, kFeatures});
    classify();
  }

  /// `n` images of random classes.
  Array images(int64_t n, std::vector<int64_t>* classes = nullptr) const {
    const int64_t per = 3 * kSize * kSize;
    Array a = normal_array({n, 3, kSize, kSize}, 0.4);
    float* p = a.data<float>();
    const float* proto = prototypes_.data<float>();
    std::uniform_int_distribution<int64_t> pick(0, kClasses - 1);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t c = classes && static_cast<int64_t>(classes->size()) > i
                            ? (*classes)[static_cast<size_t>(i)]
                            : pick(rng());
      for (int64_t k = 0; k < per; ++k) p[i * per + k] += proto[c * per + k];
    }
    return a;
  }

 private:
  static Array prototypes() {
    Array a = normal_array({kClasses, 3, kSize, kSize}, 0.5);
    float* p = a.data<float>();
    std::normal_distribution<double> d(0, 1.5);
    for (int64_t i = 0; i < kClasses * 3; ++i) {
      const auto off = static_cast<float>(d(rng()));
      for (int64_t k = 0; k < kSize * kSize; ++k) p[i * kSize * kSize + k] += off;
    }
    return a;
  }

  // logits_c = 2 mu_c . f - |mu_c|^2 with mu_c the mean features of class c (nearest centroid)
  void classify() {
    constexpr int64_t kPerClass = 16;
    std::vector<int64_t> classes;
    for (int64_t c = 0; c < kClasses; ++c) classes.insert(classes.end(), kPerClass, c);
    const Array sample = images(kClasses * kPerClass, &classes);
    const Executable e = g.compile(Device::cpu(), {{x, sample.shape()}}, {features});
    const auto f = to_f64(e.run({{x, sample}})[0]);
    std::vector<double> mu(static_cast<size_t>(kClasses * kFeatures), 0.0);
    for (size_t i = 0; i < f.size(); ++i) {
      const size_t row = i / kFeatures, c = static_cast<size_t>(classes[row]);
      mu[c * kFeatures + i % kFeatures] += f[i] / kPerClass;
    }
    std::vector<float> w(mu.size()), b(kClasses, 0.0f);
    for (size_t i = 0; i < mu.size(); ++i) {
      w[i] = static_cast<float>(2 * mu[i]);
      b[i / kFeatures] -= static_cast<float>(mu[i] * mu[i]);
    }
    logits = linear(features, g.constant(Array::from_vector(w, {kClasses, kFeatures}), "fc.weight"),
                    g.constant(Array::from_vector(b, {kClasses}), "fc.bias"));
  }

  // conv (He initialization, fan in) and an inference batch norm whose running statistics are
  // the conv's on sample images, as training leaves them: every layer's output is near unit
  // variance, as in a trained network
  Tensor conv_bn(const Tensor& in, int64_t cin, int64_t cout, int64_t k, int64_t stride,
                 const std::string& name) {
    ConvOptions o;
    o.stride = {stride, stride};
    o.padding = {k / 2, k / 2};
    const Tensor w = g.constant(
        normal_array({cout, cin, k, k}, std::sqrt(2.0 / double(cin * k * k))), name + ".weight");
    const Tensor y = conv2d(in, w, std::nullopt, o);
    const Executable e = g.compile(Device::cpu(), {{x, sample_.shape()}}, {y});
    const auto v = to_f64(e.run({{x, sample_}})[0]);
    const int64_t per = static_cast<int64_t>(v.size()) / (sample_.shape()[0] * cout);
    std::vector<double> mean(static_cast<size_t>(cout), 0.0), var(static_cast<size_t>(cout), 0.0);
    const double count = static_cast<double>(v.size()) / static_cast<double>(cout);
    for (size_t i = 0; i < v.size(); ++i)
      mean[(i / static_cast<size_t>(per)) % static_cast<size_t>(cout)] += v[i] / count;
    for (size_t i = 0; i < v.size(); ++i) {
      const size_t c = (i / static_cast<size_t>(per)) % static_cast<size_t>(cout);
      var[c] += (v[i] - mean[c]) * (v[i] - mean[c]) / count;
    }
    auto constant = [&](const std::vector<double>& d) {
      return g.constant(Array::from_vector(d, {cout}).astype(f32));
    };
    return batch_norm(y, constant(mean), constant(var),
                      g.constant(random_array({cout}, f32, 0.8, 1.2)),
                      g.constant(normal_array({cout}, 0.1)));
  }

  Tensor bottleneck(const Tensor& in, int64_t cin, int64_t width, int64_t cout, int64_t stride,
                    const std::string& name) {
    Tensor h = relu(conv_bn(in, cin, width, 1, 1, name + ".conv1"));
    h = relu(conv_bn(h, width, width, 3, stride, name + ".conv2"));
    h = conv_bn(h, width, cout, 1, 1, name + ".conv3");
    const Tensor id =
        (stride != 1 || cin != cout) ? conv_bn(in, cin, cout, 1, stride, name + ".downsample") : in;
    return relu(h + id);
  }

  Array prototypes_, sample_;
};

struct SmallEncoder {
  Graph g;
  Tensor x, y;
  static constexpr int64_t kSeq = 16, kHidden = 128, kHeads = 4, kFfn = 512, kLayers = 2;

  explicit SmallEncoder(int64_t batch) {
    x = g.placeholder({batch, kSeq, kHidden}, f32, "hidden");
    Tensor h = x;
    for (int l = 0; l < kLayers; ++l) h = layer(h, batch, "layer" + std::to_string(l));
    y = h;
  }

 private:
  Tensor dense(const Tensor& in, int64_t fin, int64_t fout, const std::string& name) {
    return linear(
        in, g.constant(normal_array({fout, fin}, 1.0 / std::sqrt(double(fin))), name + ".weight"),
        g.constant(normal_array({fout}, 0.1), name + ".bias"));
  }
  Tensor norm(const Tensor& in, const std::string& name) {
    return layer_norm(in, g.constant(random_array({kHidden}, f32, 0.8, 1.2), name + ".weight"),
                      g.constant(normal_array({kHidden}, 0.1), name + ".bias"));
  }
  Tensor layer(const Tensor& in, int64_t b, const std::string& name) {
    const int64_t dh = kHidden / kHeads;
    auto heads = [&](const Tensor& t) {
      return permute(reshape(t, {b, kSeq, kHeads, dh}), {0, 2, 1, 3});
    };
    const Tensor q = heads(dense(in, kHidden, kHidden, name + ".query"));
    const Tensor k = heads(dense(in, kHidden, kHidden, name + ".key"));
    const Tensor v = heads(dense(in, kHidden, kHidden, name + ".value"));
    const Tensor p = softmax(matmul(q, permute(k, {0, 1, 3, 2})) * (1.0 / std::sqrt(double(dh))));
    const Tensor ctx = reshape(permute(matmul(p, v), {0, 2, 1, 3}), {b, kSeq, kHidden});
    const Tensor a = norm(dense(ctx, kHidden, kHidden, name + ".output") + in, name + ".norm1");
    const Tensor f =
        dense(gelu(dense(a, kHidden, kFfn, name + ".ffn1")), kFfn, kHidden, name + ".ffn2");
    return norm(f + a, name + ".norm2");
  }
};

}  // namespace kiln::test
