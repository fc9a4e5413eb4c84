// Training steps of three small models, for the determinism test
// (tests/cuda/test_determinism.cpp) and its benchmark (bench/gpu/bench_determinism.cpp): a
// ResNet-shaped CNN (convs, batch norm, max pooling, relu, residual blocks, global average
// pooling, linear, softmax cross entropy; SGD with momentum), a BERT-tiny-shaped encoder (token and
// position embeddings, layer norm, attention, GELU MLP, token classification; AdamW) and an LSTM
// classifier (two layers; Adam). Every value (weights, batches) comes from a fixed seed, so two
// builds, in one process or two, start from the same bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/kiln.h"

namespace kiln_bench {

/// Sizes of the three models: `small` for the tests, larger ones for the benchmark.
struct NetSizes {
  int64_t batch = 4;
  // ResNet: input (batch, 3, image, image), `width` channels after the stem, twice after the
  // downsampling block
  int64_t image = 16, width = 12;
  // BERT: sequence length, hidden size, heads, MLP size, layers, vocabulary
  int64_t seq = 16, hidden = 64, heads = 2, mlp = 128, layers = 2, vocab = 100;
  // LSTM: steps, input size, hidden size, classes
  int64_t steps = 12, input = 16, lstm_hidden = 128, classes = 10;
  static NetSizes small() { return {}; }
  static NetSizes bench() {
    NetSizes s;
    s.batch = 32;
    s.image = 32, s.width = 64;
    s.seq = 128, s.hidden = 256, s.heads = 4, s.mlp = 1024, s.layers = 4, s.vocab = 1000;
    s.steps = 50, s.input = 128, s.lstm_hidden = 256;
    return s;
  }
};

/// Values of a fixed seed (splitmix64), the same on every machine.
class FixedValues {
 public:
  explicit FixedValues(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// f32 values uniform in [lo, hi).
  kiln::Array uniform(const kiln::Shape& shape, double lo, double hi) {
    std::vector<float> v(static_cast<size_t>(kiln::numel(shape)));
    for (float& x : v)
      x = static_cast<float>(lo + (hi - lo) * static_cast<double>(next() >> 11) * 0x1p-53);
    return kiln::Array::from_vector(v, shape);
  }
  /// i64 values in [0, n).
  kiln::Array ints(const kiln::Shape& shape, int64_t n) {
    std::vector<int64_t> v(static_cast<size_t>(kiln::numel(shape)));
    for (int64_t& x : v) x = static_cast<int64_t>(next() % static_cast<uint64_t>(n));
    return kiln::Array::from_vector(v, shape);
  }

 private:
  uint64_t state_;
};

/// One model's training step: feeds for a few steps, the loss, the gradients of the parameters
/// and the optimizer's updates (every variable of the graph is updated by them).
struct TrainStep {
  std::string name;
  kiln::Graph graph;
  std::vector<kiln::Tensor> params, grads, updates;
  kiln::Tensor loss;
  std::vector<kiln::Feeds> batches;
  /// The step compiled for `device` with `options`: returns the loss and the gradients.
  kiln::Executable compile(kiln::Device device, const kiln::CompileOptions& options) const {
    std::vector<kiln::Tensor> targets{loss};
    targets.insert(targets.end(), grads.begin(), grads.end());
    return graph.compile(device, {}, targets, updates, options);
  }
};

namespace nets_detail {

inline double fan_in_range(int64_t fan_in) { return 1.5 / std::sqrt(static_cast<double>(fan_in)); }

}  // namespace nets_detail

/// The ResNet-shaped CNN (f32, NCHW in the graph): a 3x3 stem conv with batch norm and relu, 3x3
/// stride-2 max pooling, a residual block, a downsampling block (3x3 and 1x1 stride-2 convs,
/// added), global average pooling, linear, softmax cross entropy; SGD with momentum.
inline TrainStep resnet_small(const NetSizes& s, int num_batches = 3) {
  using namespace kiln;
  TrainStep t;
  t.name = "resnet_small";
  Graph& g = t.graph;
  FixedValues r(1);
  const Tensor x = g.placeholder({s.batch, 3, s.image, s.image}, f32, "x");
  const Tensor labels = g.placeholder({s.batch}, i64, "labels");
  int count = 0;
  auto param = [&](const Array& a) {
    const Tensor p = g.variable(a, "p" + std::to_string(count++));
    t.params.push_back(p);
    return p;
  };
  std::vector<Tensor> bn_updates;
  auto conv = [&](const Tensor& h, int64_t o, int64_t k, int64_t stride) {
    const int64_t c = h.shape()[1];
    ConvOptions opt;
    opt.stride = {stride, stride};
    opt.padding = {k / 2, k / 2};
    const double b = nets_detail::fan_in_range(c * k * k);
    return conv2d(h, param(r.uniform({o, c, k, k}, -b, b)), std::nullopt, opt);
  };
  auto bn = [&](const Tensor& h) {
    const int64_t c = h.shape()[1];
    const Tensor w = param(r.uniform({c}, 0.5, 1.5)), b = param(r.uniform({c}, -0.5, 0.5));
    const Tensor rm = g.variable(Array::zeros({c}, f32));
    const Tensor rv = g.variable(Array::from_vector(std::vector<float>(c, 1.0f), {c}));
    BatchNormTraining n = batch_norm_training(h, rm, rv, w, b, 0.1, 1e-5);
    bn_updates.insert(bn_updates.end(), n.updates.begin(), n.updates.end());
    return n.y;
  };
  const int64_t w = s.width;
  Tensor h = relu(bn(conv(x, w, 3, 1)));
  h = max_pool(h, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}});
  h = relu(bn(conv(relu(bn(conv(h, w, 3, 1))), w, 3, 1)) + h);
  h = relu(bn(conv(relu(bn(conv(h, 2 * w, 3, 2))), 2 * w, 3, 1)) + bn(conv(h, 2 * w, 1, 2)));
  h = reshape(global_avg_pool(h), {s.batch, 2 * w});
  const double lb = nets_detail::fan_in_range(2 * w);
  const Tensor logits = linear(h, param(r.uniform({10, 2 * w}, -lb, lb)),
                               param(r.uniform({10}, -lb, lb)));
  t.loss = softmax_cross_entropy(logits, labels);
  t.grads = gradients(t.loss, t.params);
  t.updates = optim::sgd(g, t.params, t.grads, {.lr = 0.05, .momentum = 0.9});
  t.updates.insert(t.updates.end(), bn_updates.begin(), bn_updates.end());
  for (int i = 0; i < num_batches; ++i)
    t.batches.push_back({{x, r.uniform({s.batch, 3, s.image, s.image}, -2, 2)},
                         {labels, r.ints({s.batch}, 10)}});
  return t;
}

/// The BERT-tiny-shaped encoder (f32): token and position embeddings, layer norm, then `layers`
/// blocks of multi-head attention and a GELU MLP (post-norm residuals), and a token classifier
/// over the vocabulary with softmax cross entropy; AdamW.
inline TrainStep bert_tiny(const NetSizes& s, int num_batches = 3) {
  using namespace kiln;
  TrainStep t;
  t.name = "bert_tiny";
  Graph& g = t.graph;
  FixedValues r(2);
  const int64_t B = s.batch, L = s.seq, H = s.hidden, heads = s.heads, dh = H / heads;
  const Tensor tokens = g.placeholder({B, L}, i64, "tokens");
  const Tensor labels = g.placeholder({B * L}, i64, "labels");
  int count = 0;
  auto param = [&](const Array& a) {
    const Tensor p = g.variable(a, "p" + std::to_string(count++));
    t.params.push_back(p);
    return p;
  };
  auto dense = [&](const Tensor& h, int64_t out) {
    const int64_t in = h.shape().back();
    const double b = nets_detail::fan_in_range(in);
    return linear(h, param(r.uniform({out, in}, -b, b)), param(r.uniform({out}, -b, b)));
  };
  auto norm = [&](const Tensor& h) {
    return layer_norm(h, param(r.uniform({H}, 0.8, 1.2)), param(r.uniform({H}, -0.1, 0.1)));
  };
  const Tensor emb = param(r.uniform({s.vocab, H}, -0.5, 0.5));
  const Tensor pos = param(r.uniform({L, H}, -0.5, 0.5));
  Tensor h = norm(embedding(emb, tokens) + pos);  // (B, L, H)
  auto heads_of = [&](const Tensor& v) {  // (B, L, H) -> (B, heads, L, dh)
    return transpose(reshape(v, {B, L, heads, dh}), {0, 2, 1, 3});
  };
  for (int64_t l = 0; l < s.layers; ++l) {
    const Tensor q = heads_of(dense(h, H)), k = heads_of(dense(h, H)), v = heads_of(dense(h, H));
    const Tensor a = reshape(transpose(scaled_dot_product_attention(q, k, v), {0, 2, 1, 3}),
                             {B, L, H});
    h = norm(h + dense(a, H));
    h = norm(h + dense(gelu(dense(h, s.mlp)), H));
  }
  const Tensor logits = reshape(dense(h, s.vocab), {B * L, s.vocab});
  t.loss = softmax_cross_entropy(logits, labels);
  t.grads = gradients(t.loss, t.params);
  t.updates = optim::adamw(g, t.params, t.grads, {.lr = 1e-3, .weight_decay = 0.01});
  for (int i = 0; i < num_batches; ++i)
    t.batches.push_back({{tokens, r.ints({B, L}, s.vocab)}, {labels, r.ints({B * L}, s.vocab)}});
  return t;
}

/// The LSTM classifier (f32): two stacked LSTM layers over (steps, batch, input), a linear
/// classifier on the last step's hidden state, softmax cross entropy; Adam.
inline TrainStep lstm_model(const NetSizes& s, int num_batches = 3) {
  using namespace kiln;
  TrainStep t;
  t.name = "lstm";
  Graph& g = t.graph;
  FixedValues r(3);
  const int64_t T = s.steps, B = s.batch, I = s.input, H = s.lstm_hidden;
  const Tensor x = g.placeholder({T, B, I}, f32, "x");
  const Tensor labels = g.placeholder({B}, i64, "labels");
  int count = 0;
  auto param = [&](const Array& a) {
    const Tensor p = g.variable(a, "p" + std::to_string(count++));
    t.params.push_back(p);
    return p;
  };
  const double b = nets_detail::fan_in_range(H);
  std::vector<RnnLayerWeights> layers;
  for (int64_t in : {I, H})
    layers.push_back({param(r.uniform({1, 4 * H, in}, -b, b)), param(r.uniform({1, 4 * H, H}, -b, b)),
                      param(r.uniform({1, 8 * H}, -b, b)), std::nullopt});
  const RnnResult y = lstm(x, layers);
  const Tensor last = reshape(slice(y.y, {T - 1}, {T}, {}, {0}), {B, H});
  const Tensor logits =
      linear(last, param(r.uniform({s.classes, H}, -b, b)), param(r.uniform({s.classes}, -b, b)));
  t.loss = softmax_cross_entropy(logits, labels);
  t.grads = gradients(t.loss, t.params);
  t.updates = optim::adam(g, t.params, t.grads, {.lr = 1e-3});
  for (int i = 0; i < num_batches; ++i)
    t.batches.push_back({{x, r.uniform({T, B, I}, -1, 1)}, {labels, r.ints({B}, s.classes)}});
  return t;
}

/// The three models at sizes `s`.
inline std::vector<TrainStep> determinism_nets(const NetSizes& s, int num_batches = 3) {
  std::vector<TrainStep> r;
  r.push_back(resnet_small(s, num_batches));
  r.push_back(bert_tiny(s, num_batches));
  r.push_back(lstm_model(s, num_batches));
  return r;
}

}  // namespace kiln_bench
