// What the importers' Model::feeds and feed_shapes share (include/kiln/onnx.h, coreml.h): feeds
// by input name checked against the imported inputs' dtypes and shapes (-1 dims take any size).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/errors.h"
#include "kiln/graph.h"

namespace kiln::io {

/// Pairs each array with the input of that name; `skip(name)` names given that are no input to
/// feed (ONNX inputs fixed while importing). `prefix` starts the messages ("[onnx]").
template <typename Info, typename Skip>
Feeds feeds_by_name(const std::vector<Info>& inputs, const std::map<std::string, Array>& by_name,
                    const char* prefix, Skip skip) {
  Feeds r;
  for (const auto& [name, a] : by_name) {
    if (skip(name)) continue;
    const Info* info = nullptr;
    for (const auto& in : inputs)
      if (in.name == name) info = &in;
    if (!info) fail<ValueError>("{} the model has no input '{}'", prefix, name);
    if (a.dtype() != info->dtype)
      fail<DTypeError>("{} input '{}' takes {}, got {}", prefix, name, kiln::name(info->dtype),
                       kiln::name(a.dtype()));
    bool fits = a.rank() == static_cast<int>(info->shape.size());
    for (int i = 0; fits && i < a.rank(); ++i)
      fits = info->shape[i] < 0 || info->shape[i] == a.shape()[i];
    if (!fits)
      fail<ShapeError>("{} input '{}' takes shape {}, got {}", prefix, name, str(info->shape),
                       str(a.shape()));
    r.push_back({info->tensor, a});
  }
  for (const auto& in : inputs)
    if (!by_name.count(in.name)) fail<ValueError>("{} input '{}' is missing", prefix, in.name);
  return r;
}

/// The inputs' shapes for Graph::compile, those in `by_name` replaced.
template <typename Info> FeedShapes shapes_by_name(const std::vector<Info>& inputs,
                                                   const std::map<std::string, Shape>& by_name) {
  FeedShapes r;
  for (const auto& in : inputs) {
    Shape s = in.shape;
    if (auto it = by_name.find(in.name); it != by_name.end()) s = it->second;
    r.push_back({in.tensor, s});
  }
  return r;
}

}  // namespace kiln::io
