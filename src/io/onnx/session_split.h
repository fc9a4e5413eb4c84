// A model split at a node whose outputs' sizes depend on its inputs' values (NonZero, Unique,
// Compress, NonMaxSuppression, RoiAlign's adaptive grids: InputValuesNeeded naming the node), for
// onnx::Session: the nodes it depends on run as one part, the node on the host, the rest as a
// second part whose inputs from the node have dynamic dims (compiled once for every count).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/onnx.h"

namespace kiln::onnx::detail {

class SplitModel;

/// The model of `bytes` split at the top-level node whose first output is `node`; null when the
/// node is inside a subgraph (the caller imports the whole model per value instead).
/// `output_dims`: the node's output shapes as far as they do not depend on the data (-1 dims;
/// InputValuesNeeded::output_dims), which B's inputs take.
std::shared_ptr<SplitModel> split_model(const std::vector<uint8_t>& bytes, const std::string& node,
                                        const std::vector<Shape>& output_dims, Device device,
                                        const SessionOptions& options);

/// Runs the parts in turn: graph outputs by the model's order.
std::vector<kiln::onnx::Value> run_split(SplitModel& m,
                                         const std::map<std::string, kiln::onnx::Value>& feeds);

/// The graph's output names, in order.
const std::vector<std::string>& split_output_names(const SplitModel& m);
/// The parts' imports made and kept, their value inputs, and the first part's model.
int64_t split_imports(const SplitModel& m);
size_t split_kept(const SplitModel& m);
std::vector<std::string> split_value_inputs(const SplitModel& m);
std::shared_ptr<const Model> split_first_model(const SplitModel& m);

}  // namespace kiln::onnx::detail
