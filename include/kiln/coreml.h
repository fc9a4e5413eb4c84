// Core ML import: a Core ML model (an `.mlpackage` with an ML Program, or an `.mlmodel` file)
// becomes a kiln Graph with named inputs and outputs (docs/coreml.md).
//
// An ML Program's function (MIL: operations over named values, weights in the package's weight
// file) maps op by op onto kiln ops; fp16 values stay fp16. Constant weights, the constexpr ops
// that expand palettized or quantized weights included, become constants. Inputs keep the
// model's dtypes and shapes; a flexible dim (a range, or enumerated shapes that differ there)
// stays dynamic (-1) unless ImportOptions::input_shapes fixes it. An image input is a float
// tensor (1, C, H, W) of pixel values, C = 3 (RGB or BGR as the model declares) or 1 (grayscale).
// Unsupported models raise one UnsupportedError listing every unsupported op type with where it
// is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/array.h"
#include "kiln/graph.h"

namespace kiln::coreml {

struct ImportOptions {
  /// Concrete shapes of inputs by name: they fix flexible dims (and must fit the model's).
  std::map<std::string, Shape> input_shapes;
  /// The ML Program function to import ("": the model's default, `main`).
  std::string function;
  /// Directory the weight file references (`@model_path/...`) are read from; import(path) uses
  /// the model file's directory. Empty for import_bytes: a model with weight files is an IoError.
  std::string weights_dir;
};

/// A model input or output.
struct ValueInfo {
  std::string name;
  Tensor tensor;
  DType dtype = f32;
  /// Shape as imported (-1 for a flexible dim).
  Shape shape;
  /// For an image input: "RGB", "BGR" or "GRAYSCALE" (the channel order of the tensor); else "".
  std::string image;
  std::string description;
};

struct Model {
  Graph graph;
  std::vector<ValueInfo> inputs;
  std::vector<ValueInfo> outputs;
  /// Core ML specification version (5 and above for ML Programs).
  int64_t spec_version = 0;
  /// "mlProgram" or "neuralNetwork".
  std::string kind;
  /// The ML Program's function imported and its opset ("CoreML5" ...); empty otherwise.
  std::string function;
  std::string opset;
  /// The model's metadata (author, version, user-defined entries such as the converter's).
  std::map<std::string, std::string> metadata;
  /// Elements and bytes of the constants (compressed weights counted as expanded).
  int64_t parameter_count = 0;
  int64_t parameter_bytes = 0;
  /// Operation count per MIL op type (or NeuralNetwork layer type).
  std::map<std::string, int64_t> op_histogram;

  /// Output tensors in model order (compile targets).
  std::vector<Tensor> output_tensors() const;
  /// Pairs each array with the input of that name. Throws ValueError for an unknown or missing
  /// name, ShapeError/DTypeError when an array does not fit.
  Feeds feeds(const std::map<std::string, Array>& by_name) const;
  /// Shapes of the inputs, for Graph::compile (flexible dims must be fixed by `by_name`).
  FeedShapes feed_shapes(const std::map<std::string, Shape>& by_name = {}) const;
};

/// Imports an `.mlpackage` directory or an `.mlmodel` file. Throws IoError (unreadable files,
/// weight files outside the package), FormatError (not a Core ML model, inconsistent values or
/// weights), UnsupportedError (ops, layers or types kiln does not map) or ShapeError.
Model import(const std::string& path, const ImportOptions& options = {});
/// Imports a serialized Core ML `Model` message (the contents of an `.mlmodel` file).
Model import_bytes(const void* data, size_t size, const ImportOptions& options = {});

/// True when this build of kiln imports Core ML models (built with KILN_COREML).
bool available();
/// Every MIL op type the importer maps, sorted.
std::vector<std::string> supported_ops();
/// Every NeuralNetwork layer type the importer maps, named as the specification names its field
/// ("convolution", "innerProduct"), sorted.
std::vector<std::string> supported_layers();

}  // namespace kiln::coreml
