// ONNX's ai.onnx.ml ops that are tensor arithmetic, version 1: Binarizer and
// ArrayFeatureExtractor, as ONNX's reference (and ONNX Runtime) compute them.
#include "io/onnx/map_util.h"

namespace kiln::onnx::detail {

namespace {

// Binarizer: 1 where x > threshold, else 0 (NaN too), in x's dtype.
Outs binarizer(NodeContext& c) {
  const Tensor x = c.input(0);
  const double threshold = c.attr_float("threshold", 0);
  return {where(greater(x, scalar_of(x, threshold)), scalar_of(x, 1), scalar_of(x, 0))};
}

// ArrayFeatureExtractor: X's elements along its last axis at the indices Y (all of Y's values, in
// order); a 1-D X gives one row, (1, k).
Outs array_feature_extractor(NodeContext& c) {
  Tensor x = c.input(0);
  const Tensor y = c.input(1);
  if (!is_integer(y.dtype()))
    c.fail(fmt::format("Y must hold integer indices, got {}", name(y.dtype())));
  if (x.rank() == 0) c.fail("X must have at least one dim");
  if (x.rank() == 1) x = reshape(x, {1, x.dim(0)});
  return {gather(x, reshape(cast(y, i64), {-1}), x.rank() - 1)};
}

}  // namespace

void add_ml_ops(std::vector<OpEntry>& t) {
  t.insert(t.end(), {
                        {"ai.onnx.ml.Binarizer", 1, binarizer},
                        {"ai.onnx.ml.ArrayFeatureExtractor", 1, array_feature_extractor},
                    });
}

}  // namespace kiln::onnx::detail
