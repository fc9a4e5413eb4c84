// String values of ONNX models, which kiln's arrays do not hold: which nodes read or make them, and
// those nodes run on the host (StringNormalizer, StringConcat, StringSplit, RegexFullMatch,
// Equal of strings, ai.onnx.ml LabelEncoder, Constant and Identity of strings). onnx::Session
// splits a model at such a node (session_split.h) and runs it here between the parts.
#pragma once

#include <onnx/onnx_pb.h>

#include <string>
#include <vector>

#include "kiln/onnx.h"

namespace kiln::onnx::detail {

/// The first output of the first node of the model's graph, in an order where producers come
/// first, that reads or makes strings or is one of the string ops above; "" when none.
std::string first_string_node(const ::onnx::ModelProto& model);

/// Runs such a node on the host: `inputs` by the node's inputs (null for an empty name); tensors
/// are read on the host.
std::vector<kiln::onnx::Value> run_string_node(const ::onnx::NodeProto& node,
                                               const std::vector<const kiln::onnx::Value*>& inputs);

/// A TensorProto of strings as a Value.
kiln::onnx::Value strings_of(const ::onnx::TensorProto& t);

}  // namespace kiln::onnx::detail
