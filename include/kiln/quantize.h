// Post-training quantization (docs/quantization.md, "Post-training quantization"): a float model
// and a few batches of representative inputs become a QDQ graph whose convolutions and matrix
// products take int8 weights (per output channel) and int8 activations, with scales calibrated
// on the batches. fuse_quant then runs each quantize(relu?(op(dequantize(x), dequantize(w))
// (+ bias) (+ residual))) chain as one int8 kernel, and packages store the weights as int8.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kiln/executable.h"
#include "kiln/graph.h"

namespace kiln {

/// How an activation's range is chosen from what calibration observed.
enum class CalibrationMethod {
  /// The smallest and largest values seen.
  minmax,
  /// The `percentile` of the values (i8 symmetric: of |x|; u8: the (100 - p, p) percentiles),
  /// read from a histogram.
  percentile,
  /// The threshold on |x| whose clipped and quantized histogram is closest to the observed one in
  /// KL divergence (TensorRT's entropy calibration, as ONNX Runtime's entropy calibrator).
  entropy,
};
/// "minmax", "percentile", "entropy".
const char* calibration_method_name(CalibrationMethod m);
/// The inverse; throws ValueError for another name.
CalibrationMethod parse_calibration_method(const std::string& name);

struct PtqOptions {
  CalibrationMethod method = CalibrationMethod::minmax;
  /// percentile: which percentile bounds the range (in (50, 100]).
  double percentile = 99.99;
  /// Bins of the histograms that percentile and entropy read.
  int histogram_bins = 2048;
  /// Weights are i8 symmetric: one scale per output channel (else one per tensor).
  bool per_channel = true;
  /// Activations: u8 with a zero point (asymmetric), or i8 with zero point 0 (symmetric).
  DType activation_dtype = u8;
  /// Ops to quantize: any of "conv2d", "matmul", "linear". A matmul is quantized when its second
  /// operand is a constant rank-2 weight (products of two activations stay float).
  std::vector<std::string> ops = {"conv2d", "matmul", "linear"};
  /// Node names, or op names, to leave in float.
  std::vector<std::string> exclude;
  /// Also quantize an op whose result (after its bias, residual and relu) is a returned value,
  /// such as the classifier producing the logits. Off: such an op stays float, input and
  /// weights: an int8 kernel needs its result quantized, and the last layer is the one where
  /// quantization costs the most accuracy.
  bool quantize_outputs = false;
  /// An op kept float because its result is returned still stores its weights as i8 (one scale
  /// per output channel; a linear reads them through quantized_weight_linear, other ops through
  /// a dequantize when run): its math stays float, its weights shrink by 4x in the graph and in
  /// packages.
  bool int8_weights_for_outputs = true;
  /// Where calibration runs (default: kiln::default_device()).
  std::optional<Device> device;
};

/// One activation given a quantize -> dequantize pair.
struct ActivationRange {
  std::string name;         // the producing node (or "input x")
  double min = 0, max = 0;  // observed over the calibration batches
  double lo = 0, hi = 0;    // the range the method chose
  double scale = 1;
  int64_t zero_point = 0;
  DType dtype = u8;
};

/// What happened to one candidate op.
struct QuantizedOpInfo {
  std::string name;  // node name (or "<op>%<id>")
  std::string op;    // "conv2d", "matmul", "linear"
  bool quantized = false;
  /// Why it stays float (empty when quantized).
  std::string skipped_reason;
  bool per_channel = false;
  /// Kept float with its weights stored as i8 (PtqOptions::int8_weights_for_outputs).
  bool int8_weights = false;
};

struct PtqReport {
  CalibrationMethod method = CalibrationMethod::minmax;
  int64_t calibration_batches = 0;
  std::vector<QuantizedOpInfo> ops;
  std::vector<ActivationRange> activations;
  /// Bytes of the quantized weights as f32 and as stored now (int8 data plus scales).
  int64_t weight_bytes_f32 = 0, weight_bytes_int8 = 0;
  int quantized() const;
  int skipped() const;
  /// A readable table: every op with its decision, every activation with its range and scale.
  std::string str() const;
};

/// A quantized model: a new graph with the source's placeholders (same names, shapes and
/// dtypes) and outputs, in order.
struct QuantizedGraph {
  Graph graph;
  std::vector<Tensor> inputs;
  std::vector<Tensor> outputs;
  PtqReport report;
};

/// Quantizes the part of `graph` that `outputs` need. Every calibration batch feeds every
/// placeholder they read, with the same shapes in every batch (dynamic dims stay dynamic in the
/// result). Constants and variables (frozen at their current values) are the weights; batch
/// norms after convolutions are folded first. Throws ValueError for no batches, a missing
/// input or a graph that assigns variables, ShapeError / DTypeError for a batch that does not fit.
QuantizedGraph post_training_quantize(const Graph& graph, const std::vector<Tensor>& outputs,
                                      const std::vector<Feeds>& calibration,
                                      const PtqOptions& options = {});
/// The same for a compiled or loaded executable (a package), with batches by input name. The
/// result has the executable's compiled shapes.
QuantizedGraph post_training_quantize(const Executable& model,
                                      const std::vector<std::map<std::string, Array>>& calibration,
                                      const PtqOptions& options = {});

}  // namespace kiln
