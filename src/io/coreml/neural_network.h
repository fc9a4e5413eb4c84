// NeuralNetwork models (the older `.mlmodel` format: neuralNetwork, neuralNetworkClassifier and
// neuralNetworkRegressor) mapped layer by layer onto kiln ops (docs/coreml.md).
//
// Blobs keep the model's ranks where the network uses EXACT_ARRAY_MAPPING; under the rank-5
// mapping every blob is (Batch, C, H, W) with batch 1 (the rank-5 blob without its sequence axis,
// which is 1 for the inputs such a model declares). Layers that name "C", "H" and "W" read
// axes -3, -2 and -1, as the specification says for both mappings. Weights are read as f32
// (fp16 and quantized weights are expanded).
#pragma once

#include <fmt/format.h>

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "Model.pb.h"
#include "NeuralNetwork.pb.h"
#include "core/errors.h"
#include "kiln/coreml.h"

namespace kiln::coreml::detail {

/// Fills `m` (graph, inputs, outputs, kind "neuralNetwork", op_histogram by layer type,
/// parameter counts) from a model whose type is one of the three NeuralNetwork types. Throws
/// UnsupportedError listing every layer type kiln does not map with the layers' names,
/// ValueError or FormatError naming the layer for parameters it cannot read.
void import_neural_network(const ::CoreML::Specification::Model& spec, const ImportOptions& options,
                           Model& m);

namespace nn {

namespace spec = ::CoreML::Specification;

/// One layer being mapped: its input and output blobs and its weights.
class LayerContext {
 public:
  LayerContext(Graph& g, std::map<std::string, Tensor>& blobs, Model& m,
               const spec::NeuralNetworkLayer& layer, bool exact)
      : layer(layer), exact(exact), g_(g), blobs_(blobs), m_(m) {}

  const spec::NeuralNetworkLayer& layer;
  /// True under EXACT_ARRAY_MAPPING (blobs keep their ranks); false: blobs are (B, C, H, W).
  const bool exact;

  Graph& graph() { return g_; }
  int num_inputs() const { return layer.input_size(); }
  /// Input blob k (fails naming the layer when it is missing).
  Tensor in(int k = 0);
  std::vector<Tensor> ins();
  /// Sets output blob k.
  void set(int k, const Tensor& t);
  void set(const std::vector<Tensor>& outs);
  /// A layer's weights as an f32 array of `shape` (float, fp16, raw f32 or quantized values;
  /// `channel_axis` is the axis linear quantization's per-channel scale and bias follow),
  /// counted in the model's parameters.
  Array weights(const spec::WeightParams& w, const Shape& shape, const std::string& what,
                int channel_axis = 0);
  /// weights() as a constant of the graph.
  Tensor weight(const spec::WeightParams& w, const Shape& shape, const std::string& what,
                int channel_axis = 0);
  /// A constant of the graph from f64 values.
  Tensor constant_of(const std::vector<double>& v, const Shape& shape);

  /// "layer 'name' (type)", for messages.
  std::string where() const;
  template <typename... A> [[noreturn]] void fail(fmt::format_string<A...> f, A&&... args) const {
    kiln::fail<ValueError>("[coreml] {}: {}", where(), fmt::format(f, std::forward<A>(args)...));
  }
  template <typename... A>
  [[noreturn]] void unsupported(fmt::format_string<A...> f, A&&... args) const {
    kiln::fail<UnsupportedError>("[coreml] {}: {}", where(),
                                 fmt::format(f, std::forward<A>(args)...));
  }
  /// Normalizes axis `a` against `rank`, or fails naming the layer.
  int64_t axis(int64_t a, int64_t rank) const;

 private:
  Graph& g_;
  std::map<std::string, Tensor>& blobs_;
  Model& m_;
};

using LayerMapper = std::function<void(LayerContext&)>;
/// Mappers by layer type (spec::NeuralNetworkLayer::LayerCase).
using LayerTable = std::map<int, LayerMapper>;

/// The layer type's name as the specification spells its field ("convolution", "innerProduct").
std::string layer_type_name(int layer_case);
/// The layers of neural_network_layers.cpp (the rank-5 era layers) and of neural_network.cpp
/// (the ND layers of specification version 4 onwards).
void add_layers(LayerTable& t);
void add_nd_layers(LayerTable& t);

}  // namespace nn
}  // namespace kiln::coreml::detail
