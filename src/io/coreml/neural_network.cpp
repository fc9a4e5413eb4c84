// NeuralNetwork models (src/io/coreml/neural_network.h): inputs and their preprocessing, the
// layer loop and its unsupported-layer report, weights, outputs, and the ND layers of
// specification version 4 onwards (the rank-5 era layers are in neural_network_layers.cpp).
#include "io/coreml/neural_network.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "io/coreml/mil.h"
#include "kiln/ops/core.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/norm.h"
#include "kiln/ops/rearrange.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/transform.h"

namespace kiln::coreml::detail {
namespace nn {

using L = spec::NeuralNetworkLayer;

std::string layer_type_name(int layer_case) {
  static const std::map<int, const char*> names = {
      {L::kConvolution, "convolution"},
      {L::kPooling, "pooling"},
      {L::kActivation, "activation"},
      {L::kInnerProduct, "innerProduct"},
      {L::kEmbedding, "embedding"},
      {L::kBatchnorm, "batchnorm"},
      {L::kMvn, "mvn"},
      {L::kL2Normalize, "l2normalize"},
      {L::kSoftmax, "softmax"},
      {L::kLrn, "lrn"},
      {L::kCrop, "crop"},
      {L::kPadding, "padding"},
      {L::kUpsample, "upsample"},
      {L::kResizeBilinear, "resizeBilinear"},
      {L::kCropResize, "cropResize"},
      {L::kUnary, "unary"},
      {L::kAdd, "add"},
      {L::kMultiply, "multiply"},
      {L::kAverage, "average"},
      {L::kScale, "scale"},
      {L::kBias, "bias"},
      {L::kMax, "max"},
      {L::kMin, "min"},
      {L::kDot, "dot"},
      {L::kReduce, "reduce"},
      {L::kLoadConstant, "loadConstant"},
      {L::kReshape, "reshape"},
      {L::kFlatten, "flatten"},
      {L::kPermute, "permute"},
      {L::kConcat, "concat"},
      {L::kSplit, "split"},
      {L::kSequenceRepeat, "sequenceRepeat"},
      {L::kReorganizeData, "reorganizeData"},
      {L::kSlice, "slice"},
      {L::kSimpleRecurrent, "simpleRecurrent"},
      {L::kGru, "gru"},
      {L::kUniDirectionalLSTM, "uniDirectionalLSTM"},
      {L::kBiDirectionalLSTM, "biDirectionalLSTM"},
      {L::kCustom, "custom"},
      {L::kCopy, "copy"},
      {L::kBranch, "branch"},
      {L::kLoop, "loop"},
      {L::kLoopBreak, "loopBreak"},
      {L::kLoopContinue, "loopContinue"},
      {L::kRangeStatic, "rangeStatic"},
      {L::kRangeDynamic, "rangeDynamic"},
      {L::kClip, "clip"},
      {L::kCeil, "ceil"},
      {L::kFloor, "floor"},
      {L::kSign, "sign"},
      {L::kRound, "round"},
      {L::kExp2, "exp2"},
      {L::kSin, "sin"},
      {L::kCos, "cos"},
      {L::kTan, "tan"},
      {L::kAsin, "asin"},
      {L::kAcos, "acos"},
      {L::kAtan, "atan"},
      {L::kSinh, "sinh"},
      {L::kCosh, "cosh"},
      {L::kTanh, "tanh"},
      {L::kAsinh, "asinh"},
      {L::kAcosh, "acosh"},
      {L::kAtanh, "atanh"},
      {L::kErf, "erf"},
      {L::kGelu, "gelu"},
      {L::kEqual, "equal"},
      {L::kNotEqual, "notEqual"},
      {L::kLessThan, "lessThan"},
      {L::kLessEqual, "lessEqual"},
      {L::kGreaterThan, "greaterThan"},
      {L::kGreaterEqual, "greaterEqual"},
      {L::kLogicalOr, "logicalOr"},
      {L::kLogicalXor, "logicalXor"},
      {L::kLogicalNot, "logicalNot"},
      {L::kLogicalAnd, "logicalAnd"},
      {L::kModBroadcastable, "modBroadcastable"},
      {L::kMinBroadcastable, "minBroadcastable"},
      {L::kMaxBroadcastable, "maxBroadcastable"},
      {L::kAddBroadcastable, "addBroadcastable"},
      {L::kPowBroadcastable, "powBroadcastable"},
      {L::kDivideBroadcastable, "divideBroadcastable"},
      {L::kFloorDivBroadcastable, "floorDivBroadcastable"},
      {L::kMultiplyBroadcastable, "multiplyBroadcastable"},
      {L::kSubtractBroadcastable, "subtractBroadcastable"},
      {L::kTile, "tile"},
      {L::kStack, "stack"},
      {L::kGather, "gather"},
      {L::kScatter, "scatter"},
      {L::kGatherND, "gatherND"},
      {L::kScatterND, "scatterND"},
      {L::kSoftmaxND, "softmaxND"},
      {L::kGatherAlongAxis, "gatherAlongAxis"},
      {L::kScatterAlongAxis, "scatterAlongAxis"},
      {L::kReverse, "reverse"},
      {L::kReverseSeq, "reverseSeq"},
      {L::kSplitND, "splitND"},
      {L::kConcatND, "concatND"},
      {L::kTranspose, "transpose"},
      {L::kSliceStatic, "sliceStatic"},
      {L::kSliceDynamic, "sliceDynamic"},
      {L::kSlidingWindows, "slidingWindows"},
      {L::kTopK, "topK"},
      {L::kArgMin, "argMin"},
      {L::kArgMax, "argMax"},
      {L::kEmbeddingND, "embeddingND"},
      {L::kBatchedMatmul, "batchedMatmul"},
      {L::kGetShape, "getShape"},
      {L::kLoadConstantND, "loadConstantND"},
      {L::kFillLike, "fillLike"},
      {L::kFillStatic, "fillStatic"},
      {L::kFillDynamic, "fillDynamic"},
      {L::kBroadcastToLike, "broadcastToLike"},
      {L::kBroadcastToStatic, "broadcastToStatic"},
      {L::kBroadcastToDynamic, "broadcastToDynamic"},
      {L::kSqueeze, "squeeze"},
      {L::kExpandDims, "expandDims"},
      {L::kFlattenTo2D, "flattenTo2D"},
      {L::kReshapeLike, "reshapeLike"},
      {L::kReshapeStatic, "reshapeStatic"},
      {L::kReshapeDynamic, "reshapeDynamic"},
      {L::kRankPreservingReshape, "rankPreservingReshape"},
      {L::kConstantPad, "constantPad"},
      {L::kRandomNormalLike, "randomNormalLike"},
      {L::kRandomNormalStatic, "randomNormalStatic"},
      {L::kRandomNormalDynamic, "randomNormalDynamic"},
      {L::kRandomUniformLike, "randomUniformLike"},
      {L::kRandomUniformStatic, "randomUniformStatic"},
      {L::kRandomUniformDynamic, "randomUniformDynamic"},
      {L::kRandomBernoulliLike, "randomBernoulliLike"},
      {L::kRandomBernoulliStatic, "randomBernoulliStatic"},
      {L::kRandomBernoulliDynamic, "randomBernoulliDynamic"},
      {L::kCategoricalDistribution, "categoricalDistribution"},
      {L::kReduceL1, "reduceL1"},
      {L::kReduceL2, "reduceL2"},
      {L::kReduceMax, "reduceMax"},
      {L::kReduceMin, "reduceMin"},
      {L::kReduceSum, "reduceSum"},
      {L::kReduceProd, "reduceProd"},
      {L::kReduceMean, "reduceMean"},
      {L::kReduceLogSum, "reduceLogSum"},
      {L::kReduceSumSquare, "reduceSumSquare"},
      {L::kReduceLogSumExp, "reduceLogSumExp"},
      {L::kWhereNonZero, "whereNonZero"},
      {L::kMatrixBandPart, "matrixBandPart"},
      {L::kLowerTriangular, "lowerTriangular"},
      {L::kUpperTriangular, "upperTriangular"},
      {L::kWhereBroadcastable, "whereBroadcastable"},
      {L::kLayerNormalization, "layerNormalization"},
      {L::kNonMaximumSuppression, "nonMaximumSuppression"},
      {L::kOneHot, "oneHot"},
      {L::kCumSum, "cumSum"},
      {L::kClampedReLU, "clampedReLU"},
      {L::kArgSort, "argSort"},
      {L::kPooling3D, "pooling3d"},
      {L::kGlobalPooling3D, "globalPooling3d"},
      {L::kSliceBySize, "sliceBySize"},
      {L::kConvolution3D, "convolution3d"},
  };
  auto it = names.find(layer_case);
  return it == names.end() ? fmt::format("layer type {}", layer_case) : it->second;
}

// ---- LayerContext ----

std::string LayerContext::where() const {
  return fmt::format("layer '{}' ({})", layer.name(), layer_type_name(layer.layer_case()));
}

int64_t LayerContext::axis(int64_t a, int64_t rank) const {
  const int64_t r = a < 0 ? a + rank : a;
  if (r < 0 || r >= rank) fail("axis {} is out of range for rank {}", a, rank);
  return r;
}

Tensor LayerContext::in(int k) {
  if (k >= layer.input_size()) fail("has {} inputs, needs input {}", layer.input_size(), k + 1);
  auto it = blobs_.find(layer.input(k));
  if (it == blobs_.end())
    kiln::fail<FormatError>("[coreml] {}: blob '{}' is read before a layer makes it", where(),
                            layer.input(k));
  return it->second;
}

std::vector<Tensor> LayerContext::ins() {
  std::vector<Tensor> r;
  for (int k = 0; k < layer.input_size(); ++k) r.push_back(in(k));
  return r;
}

void LayerContext::set(int k, const Tensor& t) {
  if (k >= layer.output_size())
    fail("gives {} outputs, the model names {}", k + 1, layer.output_size());
  blobs_[layer.output(k)] = t;
}

void LayerContext::set(const std::vector<Tensor>& outs) {
  if (static_cast<int>(outs.size()) != layer.output_size())
    fail("gives {} outputs, the model names {}", outs.size(), layer.output_size());
  for (size_t k = 0; k < outs.size(); ++k) set(static_cast<int>(k), outs[k]);
}

Array LayerContext::weights(const spec::WeightParams& w, const Shape& shape,
                            const std::string& what, int channel_axis) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d && n > std::numeric_limits<int32_t>::max() / d))
      fail("{} has shape {}, which cannot be read", what, str(shape));
    n *= d;
  }
  std::vector<float> v;
  if (w.floatvalue_size()) {
    v.assign(w.floatvalue().begin(), w.floatvalue().end());
  } else if (!w.float16value().empty()) {
    const std::string& b = w.float16value();
    if (b.size() != static_cast<size_t>(n) * 2)
      fail("{}: {} bytes of fp16 values for shape {}", what, b.size(), str(shape));
    const Array h = Array::from_data(b.data(), shape, f16).astype(f32);
    v.assign(h.data<float>(), h.data<float>() + n);
  } else if (w.has_quantization()) {
    const auto& q = w.quantization();
    const int bits = static_cast<int>(q.numberofbits());
    if (bits < 1 || bits > 8)
      unsupported("{} is quantized to {} bits (1 to 8 are read)", what, bits);
    const std::string& raw = w.rawvalue();
    if (raw.size() * 8 < static_cast<size_t>(n) * bits)
      fail("{}: {} bytes hold fewer than {} values of {} bits", what, raw.size(), n, bits);
    // values are packed most significant bit first, unsigned
    std::vector<uint32_t> codes(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      uint32_t c = 0;
      for (int b = 0; b < bits; ++b) {
        const uint64_t bit = static_cast<uint64_t>(i) * bits + b;
        c = (c << 1) | ((static_cast<uint8_t>(raw[bit / 8]) >> (7 - bit % 8)) & 1u);
      }
      codes[static_cast<size_t>(i)] = c;
    }
    v.resize(static_cast<size_t>(n));
    if (q.has_linearquantization()) {
      const auto& lq = q.linearquantization();
      const int64_t channels = shape.empty() ? 1 : shape[static_cast<size_t>(channel_axis)];
      if (lq.scale_size() != lq.bias_size() ||
          (lq.scale_size() != 1 && lq.scale_size() != channels))
        fail("{}: linear quantization has {} scales and {} biases for {} channels", what,
             lq.scale_size(), lq.bias_size(), channels);
      int64_t inner = 1;
      for (size_t d = static_cast<size_t>(channel_axis) + 1; d < shape.size(); ++d)
        inner *= shape[d];
      for (int64_t i = 0; i < n; ++i) {
        const int c = lq.scale_size() == 1 ? 0 : static_cast<int>((i / inner) % channels);
        v[static_cast<size_t>(i)] =
            lq.scale(c) * static_cast<float>(codes[static_cast<size_t>(i)]) + lq.bias(c);
      }
    } else if (q.has_lookuptablequantization()) {
      const auto& lut = q.lookuptablequantization().floatvalue();
      if (lut.size() != (1 << bits))
        fail("{}: a lookup table of {} values for {} bits", what, lut.size(), bits);
      for (int64_t i = 0; i < n; ++i)
        v[static_cast<size_t>(i)] = lut[static_cast<int>(codes[static_cast<size_t>(i)])];
    } else {
      unsupported("{} has a quantization kind kiln does not read", what);
    }
  } else if (!w.rawvalue().empty()) {
    if (w.rawvalue().size() != static_cast<size_t>(n) * 4)
      fail("{}: {} raw bytes for shape {} (raw values are read as f32)", what, w.rawvalue().size(),
           str(shape));
    v.resize(static_cast<size_t>(n));
    std::memcpy(v.data(), w.rawvalue().data(), static_cast<size_t>(n) * 4);
  }
  if (static_cast<int64_t>(v.size()) != n)
    fail("{} has {} values, shape {} needs {}", what, v.size(), str(shape), n);
  m_.parameter_count += n;
  m_.parameter_bytes += n * 4;
  return Array::from_vector(v, shape);
}

Tensor LayerContext::weight(const spec::WeightParams& w, const Shape& shape,
                            const std::string& what, int channel_axis) {
  return constant(g_, weights(w, shape, what, channel_axis));
}

Tensor LayerContext::constant_of(const std::vector<double>& v, const Shape& shape) {
  return constant(g_, Array::from_vector(v, shape).astype(f32));
}

// ---- ND layers ----

namespace {

using Binary = Tensor (*)(const Tensor&, const Tensor&);
void broadcastable(LayerTable& t, int type, Binary f) {
  t[type] = [f](LayerContext& c) {
    if (c.num_inputs() != 2) c.fail("takes 2 inputs, got {}", c.num_inputs());
    c.set(0, f(c.in(0), c.in(1)));
  };
}
using Unary = Tensor (*)(const Tensor&);
void unary(LayerTable& t, int type, Unary f) {
  t[type] = [f](LayerContext& c) { c.set(0, f(c.in())); };
}

std::vector<int64_t> axes_of(LayerContext& c, const google::protobuf::RepeatedField<int64_t>& a,
                             int64_t rank) {
  std::vector<int64_t> r;
  for (int64_t x : a) r.push_back(c.axis(x, rank));
  return r;
}

template <typename P> void reduction(LayerTable& t, int type, const P& (L::*params)() const,
                                     Tensor (*f)(const Tensor&, const Axes&, bool)) {
  t[type] = [params, f](LayerContext& c) {
    const P& p = (c.layer.*params)();
    const Tensor x = c.in();
    Axes axes;
    if (!p.reduceall()) axes = axes_of(c, p.axes(), x.rank());
    c.set(0, f(x, axes, p.keepdims()));
  };
}

Tensor sum_square(const Tensor& x, const Axes& a, bool k) { return sum(x * x, a, k); }
Tensor reduce_log_sum(const Tensor& x, const Axes& a, bool k) { return log(sum(x, a, k)); }
Tensor gelu_exact(const Tensor& x) { return gelu(x); }
Tensor exp2(const Tensor& x) { return exp(x * 0.6931471805599453); }
Tensor swap_last_two(const Tensor& x) {
  std::vector<int64_t> perm;
  for (int d = 0; d < x.rank(); ++d) perm.push_back(d);
  if (x.rank() >= 2) std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
  return transpose(x, perm);
}

}  // namespace

void add_nd_layers(LayerTable& t) {
  broadcastable(t, L::kAddBroadcastable, add);
  broadcastable(t, L::kSubtractBroadcastable, sub);
  broadcastable(t, L::kMultiplyBroadcastable, mul);
  broadcastable(t, L::kDivideBroadcastable, div);
  broadcastable(t, L::kMaxBroadcastable, maximum);
  broadcastable(t, L::kMinBroadcastable, minimum);
  broadcastable(t, L::kPowBroadcastable, pow);
  unary(t, L::kCeil, ceil);
  unary(t, L::kFloor, floor);
  unary(t, L::kRound, round);
  unary(t, L::kSign, sign);
  unary(t, L::kSin, sin);
  unary(t, L::kCos, cos);
  unary(t, L::kTan, tan);
  unary(t, L::kAsin, asin);
  unary(t, L::kAcos, acos);
  unary(t, L::kAtan, atan);
  unary(t, L::kSinh, sinh);
  unary(t, L::kCosh, cosh);
  unary(t, L::kTanh, tanh);
  unary(t, L::kAsinh, asinh);
  unary(t, L::kAcosh, acosh);
  unary(t, L::kAtanh, atanh);
  unary(t, L::kErf, erf);
  unary(t, L::kExp2, exp2);
  t[L::kCopy] = [](LayerContext& c) { c.set(0, c.in()); };
  t[L::kGelu] = [](LayerContext& c) {
    const auto mode = c.layer.gelu().mode();
    if (mode == spec::GeluLayerParams_GeluMode_EXACT) c.set(0, gelu_exact(c.in()));
    else if (mode == spec::GeluLayerParams_GeluMode_TANH_APPROXIMATION)
      c.set(0, gelu(c.in(), GeluApprox::tanh));
    else c.set(0, c.in() * sigmoid(c.in() * 1.702));
  };
  t[L::kClip] = [](LayerContext& c) {
    c.set(0, clip(c.in(), c.layer.clip().minval(), c.layer.clip().maxval()));
  };
  t[L::kSoftmaxND] = [](LayerContext& c) {
    const Tensor x = c.in();
    c.set(0, softmax(x, c.axis(c.layer.softmaxnd().axis(), x.rank())));
  };
  t[L::kConcatND] = [](LayerContext& c) {
    const auto& p = c.layer.concatnd();
    if (p.interleave()) c.unsupported("interleave is not mapped");
    const std::vector<Tensor> xs = c.ins();
    c.set(0, concat(xs, c.axis(p.axis(), xs.at(0).rank())));
  };
  t[L::kSplitND] = [](LayerContext& c) {
    const auto& p = c.layer.splitnd();
    const Tensor x = c.in();
    const int64_t a = c.axis(p.axis(), x.rank());
    if (p.splitsizes_size()) {
      std::vector<int64_t> sizes(p.splitsizes().begin(), p.splitsizes().end());
      c.set(split(x, sizes, a));
    } else {
      const int64_t n = p.numsplits() ? static_cast<int64_t>(p.numsplits()) : c.layer.output_size();
      c.set(split(x, n, a));
    }
  };
  t[L::kTranspose] = [](LayerContext& c) {
    std::vector<int64_t> perm(c.layer.transpose().axes().begin(), c.layer.transpose().axes().end());
    c.set(0, transpose(c.in(), perm));
  };
  t[L::kReshapeStatic] = [](LayerContext& c) {
    const auto& s = c.layer.reshapestatic().targetshape();
    c.set(0, reshape(c.in(), Shape(s.begin(), s.end())));
  };
  t[L::kRankPreservingReshape] = [](LayerContext& c) {
    const Tensor x = c.in();
    const auto& s = c.layer.rankpreservingreshape().targetshape();
    Shape target(s.begin(), s.end());
    if (static_cast<int>(target.size()) != x.rank())
      c.fail("target shape {} has another rank than the input's {}", str(target), str(x.shape()));
    for (size_t d = 0; d < target.size(); ++d)
      if (target[d] == 0) target[d] = x.dim(static_cast<int>(d));
    c.set(0, reshape(x, target));
  };
  t[L::kFlattenTo2D] = [](LayerContext& c) {
    const Tensor x = c.in();
    const int64_t a = c.layer.flattento2d().axis();
    const int64_t split_at = a < 0 ? a + x.rank() : a;
    if (split_at < 0 || split_at > x.rank()) c.fail("axis {} for rank {}", a, x.rank());
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < x.rank(); ++d) (d < split_at ? outer : inner) *= x.dim(d);
    c.set(0, reshape(x, {outer, inner}));
  };
  t[L::kSqueeze] = [](LayerContext& c) {
    const Tensor x = c.in();
    const auto& p = c.layer.squeeze();
    if (p.squeezeall()) c.set(0, squeeze(x));
    else c.set(0, squeeze(x, axes_of(c, p.axes(), x.rank())));
  };
  t[L::kExpandDims] = [](LayerContext& c) {
    const Tensor x = c.in();
    const auto& a = c.layer.expanddims().axes();
    const int64_t rank = x.rank() + a.size();
    c.set(0, expand_dims(x, axes_of(c, a, rank)));
  };
  t[L::kGather] = [](LayerContext& c) {
    const Tensor x = c.in(0);
    Tensor idx = cast(c.in(1), i64);
    const int64_t a = c.axis(c.layer.gather().axis(), x.rank());
    // negative indices count from the end
    idx = where(less(idx, scalar_like(idx, 0)),
                idx + scalar_like(idx, static_cast<double>(x.dim(a))), idx);
    c.set(0, gather(x, idx, a));
  };
  t[L::kLoadConstantND] = [](LayerContext& c) {
    const auto& p = c.layer.loadconstantnd();
    c.set(0, c.weight(p.data(), Shape(p.shape().begin(), p.shape().end()), "data"));
  };
  t[L::kEmbeddingND] = [](LayerContext& c) {
    const auto& p = c.layer.embeddingnd();
    const int64_t vocab = static_cast<int64_t>(p.vocabsize());
    const int64_t size = static_cast<int64_t>(p.embeddingsize());
    const Tensor x = c.in();
    if (x.rank() < 1 || x.dim(-1) != 1)
      c.fail("takes indices of shape (..., 1), got {}", str(x.shape()));
    const Tensor table = transpose(c.weight(p.weights(), {size, vocab}, "weights"));
    Tensor y = embedding(table, cast(squeeze(x, {x.rank() - 1}), i64));
    if (p.hasbias()) y = y + c.weight(p.bias(), {size}, "bias");
    c.set(0, y);
  };
  t[L::kBatchedMatmul] = [](LayerContext& c) {
    const auto& p = c.layer.batchedmatmul();
    if (c.num_inputs() == 2) {
      Tensor a = c.in(0), b = c.in(1);
      if (p.transposea()) a = swap_last_two(a);
      if (p.transposeb()) b = swap_last_two(b);
      c.set(0, matmul(a, b));
      return;
    }
    if (p.transposea() || p.transposeb())
      c.unsupported("transposeA/transposeB with a weight matrix are not mapped");
    const int64_t rows = static_cast<int64_t>(p.weightmatrixfirstdimension());
    const int64_t cols = static_cast<int64_t>(p.weightmatrixseconddimension());
    // the weight matrix (rows, cols) is stored transposed, as linear's (out, in)
    const Tensor w = c.weight(p.weights(), {cols, rows}, "weights");
    c.set(0,
          linear(c.in(), w,
                 p.hasbias() ? std::optional(c.weight(p.bias(), {cols}, "bias")) : std::nullopt));
  };
  t[L::kLayerNormalization] = [](LayerContext& c) {
    const auto& p = c.layer.layernormalization();
    const Shape s(p.normalizedshape().begin(), p.normalizedshape().end());
    const Tensor x = c.in();
    c.set(0, layer_norm(x, c.weight(p.gamma(), s, "gamma"), c.weight(p.beta(), s, "beta"),
                        x.rank() - static_cast<int64_t>(s.size()), p.eps()));
  };
  reduction(t, L::kReduceSum, &L::reducesum, sum);
  reduction(t, L::kReduceMean, &L::reducemean, mean);
  reduction(t, L::kReduceMax, &L::reducemax, max);
  reduction(t, L::kReduceMin, &L::reducemin, min);
  reduction(t, L::kReduceProd, &L::reduceprod, prod);
  reduction(t, L::kReduceL1, &L::reducel1, norm_l1);
  reduction(t, L::kReduceL2, &L::reducel2, norm_l2);
  reduction(t, L::kReduceSumSquare, &L::reducesumsquare, sum_square);
  reduction(t, L::kReduceLogSum, &L::reducelogsum, reduce_log_sum);
  reduction(t, L::kReduceLogSumExp, &L::reducelogsumexp, logsumexp);
}

}  // namespace nn

// ---- the model ----

namespace {

using namespace nn;

// The fields the three NeuralNetwork model types share.
struct Network {
  const google::protobuf::RepeatedPtrField<spec::NeuralNetworkLayer>* layers = nullptr;
  const google::protobuf::RepeatedPtrField<spec::NeuralNetworkPreprocessing>* preprocessing =
      nullptr;
  bool exact = false;
  bool image_rank4 = false;
  std::string probabilities_blob;  // a classifier's
};

template <typename N> Network network_of(const N& n) {
  Network r;
  r.layers = &n.layers();
  r.preprocessing = &n.preprocessing();
  r.exact = n.arrayinputshapemapping() == spec::EXACT_ARRAY_MAPPING;
  r.image_rank4 = n.imageinputshapemapping() == spec::RANK4_IMAGE_MAPPING;
  return r;
}

const LayerTable& layer_table() {
  static const LayerTable t = [] {
    LayerTable r;
    add_layers(r);
    add_nd_layers(r);
    return r;
  }();
  return t;
}

DType array_dtype(const spec::ArrayFeatureType& a, const std::string& where) {
  switch (a.datatype()) {
    case spec::ArrayFeatureType_ArrayDataType_FLOAT32:
      return f32;
    case spec::ArrayFeatureType_ArrayDataType_DOUBLE:
      return f64;
    case spec::ArrayFeatureType_ArrayDataType_FLOAT16:
      return f16;
    case spec::ArrayFeatureType_ArrayDataType_INT32:
      return i32;
    default:
      fail<UnsupportedError>("[coreml] {}: multiArray data type {} is not supported", where,
                             static_cast<int>(a.datatype()));
  }
}

// The image scaler and mean image of `input` (NeuralNetworkPreprocessing), applied in the
// model's channel order: y = channelScale * x + bias[c], then y - mean.
Tensor preprocess(Graph& g, const Network& net, const std::string& input, const std::string& space,
                  bool only_image, Tensor x) {
  for (const auto& p : *net.preprocessing) {
    if (p.featurename() != input && !(p.featurename().empty() && only_image)) continue;
    const int64_t ch = x.dim(1);
    if (p.has_scaler()) {
      const auto& s = p.scaler();
      std::vector<float> bias;
      if (space == "GRAYSCALE") bias = {s.graybias()};
      else if (space == "BGR") bias = {s.bluebias(), s.greenbias(), s.redbias()};
      else bias = {s.redbias(), s.greenbias(), s.bluebias()};
      if (static_cast<int64_t>(bias.size()) != ch)
        fail<ValueError>("[coreml] input '{}': a {} scaler for {} channels", input, space, ch);
      x = x * static_cast<double>(s.channelscale()) +
          constant(g, Array::from_vector(bias, {1, ch, 1, 1}));
    } else if (p.has_meanimage()) {
      const auto& mean = p.meanimage().meanimage();
      const Shape shape = {1, ch, x.dim(2), x.dim(3)};
      if (mean.size() != ch * x.dim(2) * x.dim(3))
        fail<ValueError>("[coreml] input '{}': a mean image of {} values for shape {}", input,
                         mean.size(), str(shape));
      x = x - constant(g, Array::from_vector(std::vector<float>(mean.begin(), mean.end()), shape));
    }
  }
  return x;
}

void add_inputs(const spec::Model& s, const Network& net, const ImportOptions& options, Model& m,
                std::map<std::string, Tensor>& blobs) {
  int images = 0;
  for (const auto& d : s.description().input()) images += d.type().has_imagetype();
  for (const auto& d : s.description().input()) {
    const std::string where = fmt::format("input '{}'", d.name());
    ValueInfo info;
    info.name = d.name();
    info.description = d.shortdescription();
    Tensor x;
    if (d.type().has_imagetype()) {
      const auto& im = d.type().imagetype();
      info.image = color_space(im);
      const int64_t ch = info.image == "GRAYSCALE" ? 1 : 3;
      info.shape = {1, ch, static_cast<int64_t>(im.height()), static_cast<int64_t>(im.width())};
      info.dtype = f32;
      info.tensor = m.graph.placeholder(info.shape, f32, d.name());
      x = preprocess(m.graph, net, d.name(), info.image, images == 1, info.tensor);
      if (net.exact && !net.image_rank4) x = expand_dims(x, {0});
    } else if (d.type().has_multiarraytype()) {
      const auto& a = d.type().multiarraytype();
      info.dtype = array_dtype(a, where);
      info.shape.assign(a.shape().begin(), a.shape().end());
      if (auto it = options.input_shapes.find(d.name()); it != options.input_shapes.end()) {
        if (it->second.size() != info.shape.size())
          fail<ShapeError>("[coreml] {} has shape {}; ImportOptions gives {}", where,
                           str(info.shape), str(it->second));
        info.shape = it->second;
      }
      info.tensor = m.graph.placeholder(info.shape, info.dtype, d.name());
      x = info.dtype == f32 ? info.tensor : cast(info.tensor, f32);
      if (!net.exact) {
        const Shape& sh = info.shape;
        if (sh.size() == 1) x = reshape(x, {1, sh[0], 1, 1});
        else if (sh.size() == 3) x = reshape(x, {1, sh[0], sh[1], sh[2]});
        else
          fail<UnsupportedError>(
              "[coreml] {}: a multiArray of shape {} under the rank-5 mapping (rank 1 or 3 is "
              "read)",
              where, str(sh));
      }
    } else {
      fail<UnsupportedError>("[coreml] {}: only multiArray and image inputs are supported", where);
    }
    blobs[d.name()] = x;
    m.inputs.push_back(std::move(info));
  }
  check_shape_names(options.input_shapes, m.inputs);
}

void add_layers_of(const Network& net, bool exact, Model& m, std::map<std::string, Tensor>& blobs) {
  const LayerTable& table = layer_table();
  std::map<std::string, std::vector<std::string>> bad;  // layer type -> layer names
  std::set<std::string> missing;                        // blobs of layers that could not be mapped
  for (const auto& layer : *net.layers) {
    const std::string type = layer_type_name(layer.layer_case());
    ++m.op_histogram[type];
    bool skip = false;
    for (const auto& i : layer.input()) skip = skip || missing.count(i);
    auto it = table.find(layer.layer_case());
    if (skip || it == table.end()) {
      if (!skip) {
        auto& w = bad[type];
        if (w.size() < 3) w.push_back(layer.name());
      }
      for (const auto& o : layer.output()) missing.insert(o);
      continue;
    }
    LayerContext c(m.graph, blobs, m, layer, exact);
    it->second(c);
    for (const auto& o : layer.output())
      if (!blobs.count(o)) c.fail("gave no value for output '{}'", o);
  }
  if (!bad.empty()) report_unsupported("NeuralNetwork layers", bad);
}

void add_outputs(const spec::Model& s, const Network& net, bool classifier, Model& m,
                 std::map<std::string, Tensor>& blobs) {
  const auto& desc = s.description();
  for (const auto& d : desc.output()) {
    if (classifier && d.name() == desc.predictedfeaturename()) continue;  // the label: a string
    std::string blob = d.name();
    const bool probabilities = classifier && d.name() == desc.predictedprobabilitiesname();
    if (probabilities && !net.probabilities_blob.empty()) blob = net.probabilities_blob;
    auto it = blobs.find(blob);
    if (it == blobs.end())
      fail<FormatError>("[coreml] output '{}': no layer makes blob '{}'", d.name(), blob);
    Tensor y = it->second;
    int64_t n = 1;
    for (int64_t dim : y.shape()) n *= dim;
    if (probabilities) {
      y = reshape(y, {n});
    } else if (d.type().has_multiarraytype() && d.type().multiarraytype().shape_size()) {
      const auto& sh = d.type().multiarraytype().shape();
      const Shape declared(sh.begin(), sh.end());
      int64_t k = 1;
      for (int64_t dim : declared) k *= dim;
      if (k == n && declared != y.shape()) y = reshape(y, declared);
      else if (!net.exact && y.rank() == 4 && y.dim(0) == 1) y = squeeze(y, {0});
    } else if (!net.exact && y.rank() == 4 && y.dim(0) == 1) {
      y = squeeze(y, {0});
    }
    // a multiArray output keeps the dtype the model declares (the layers compute in f32)
    if (d.type().has_multiarraytype() && d.type().multiarraytype().datatype())
      if (const DType want = array_dtype(d.type().multiarraytype(), "output " + d.name());
          want != y.dtype())
        y = cast(y, want);
    ValueInfo info;
    info.name = d.name();
    info.tensor = y;
    info.dtype = y.dtype();
    info.shape = y.shape();
    info.description = d.shortdescription();
    m.outputs.push_back(std::move(info));
  }
}

}  // namespace

void import_neural_network(const spec::Model& s, const ImportOptions& options, Model& m) {
  Network net;
  bool classifier = false;
  switch (s.Type_case()) {
    case spec::Model::kNeuralNetwork:
      net = network_of(s.neuralnetwork());
      break;
    case spec::Model::kNeuralNetworkRegressor:
      net = network_of(s.neuralnetworkregressor());
      break;
    case spec::Model::kNeuralNetworkClassifier:
      net = network_of(s.neuralnetworkclassifier());
      net.probabilities_blob = s.neuralnetworkclassifier().labelprobabilitylayername();
      classifier = true;
      break;
    default:
      fail<ValueError>("[coreml] the model is not a NeuralNetwork");
  }
  m.kind = "neuralNetwork";
  std::map<std::string, Tensor> blobs;
  add_inputs(s, net, options, m, blobs);
  add_layers_of(net, net.exact, m, blobs);
  add_outputs(s, net, classifier, m, blobs);
}

}  // namespace kiln::coreml::detail

namespace kiln::coreml {

std::vector<std::string> supported_layers() {
  std::vector<std::string> r;
  for (const auto& [type, mapper] : detail::layer_table())
    r.push_back(detail::nn::layer_type_name(type));
  std::sort(r.begin(), r.end());
  return r;
}

}  // namespace kiln::coreml
