// Custom ops (family custom_op): a node of `custom` or `custom_impure` runs the op registered
// under its attribute "custom_op" (src/runtime/custom_op.cpp). Attrs: custom_op (string),
// custom_library (string, the op library that registered it), then the op's own attributes
// (every declared one, defaults filled in by the builder). Inference, the gradient and the
// kernels look the op up by name, so a package holding such a node needs the op registered
// before it loads.
#include "kiln/custom_op.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>

#include "core/sym_dim.h"
#include "kiln/autodiff.h"
#include "kiln/ops/core.h"
#include "ops/common.h"
#include "runtime/custom_op.h"

namespace kiln {

using detail::kCustomLibraryKey;
using detail::kCustomOpKey;

namespace {

const char* attr_type(const AttrValue& v) {
  static const char* names[] = {"bool", "int", "float", "ints", "floats", "string", "dtype"};
  return names[v.index()];
}

std::vector<TensorInfo> infer_custom(const InferContext& ctx) {
  const auto entry = detail::custom_op_of(ctx.attrs);
  const CustomOpDef& d = entry->def;
  if (ctx.inputs.size() != d.inputs.size())
    fail<ValueError>("[{}] takes {} inputs, got {}", d.name, d.inputs.size(), ctx.inputs.size());
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    const TensorInfo& t = ctx.inputs[i];
    if (!d.inputs[i].dtypes.has(t.dtype))
      fail<DTypeError>("[{}] input {} ('{}') has dtype {}, which the op does not take", d.name, i,
                       d.inputs[i].name, name(t.dtype));
    shapes.push_back(sym::erase(t.shape));  // (dynamic dims are -1 to shape functions)
    dtypes.push_back(t.dtype);
  }
  std::vector<Shape> out_shapes;
  if (d.shape) {
    out_shapes = d.shape(CustomShapeContext{d.name, ctx.attrs, shapes, dtypes});
    if (out_shapes.size() != d.outputs.size())
      fail<ShapeError>("[{}] the shape function gave {} shapes for {} outputs", d.name,
                       out_shapes.size(), d.outputs.size());
  } else {
    out_shapes.assign(d.outputs.size(), shapes[0]);
  }
  std::vector<TensorInfo> out;
  for (size_t o = 0; o < d.outputs.size(); ++o) {
    for (int64_t dim : out_shapes[o])
      if (dim < -1)
        fail<ShapeError>("[{}] the shape function gave output {} the shape {}", d.name, o,
                         str(out_shapes[o]));
    const CustomOutput& spec = d.outputs[o];
    out.push_back({out_shapes[o], spec.like_input >= 0 ? dtypes[spec.like_input] : spec.dtype});
  }
  return out;
}

std::vector<std::optional<Tensor>> vjp_custom(const VjpContext& c) {
  const auto entry = detail::custom_op_of(c.attrs);
  const CustomOpDef& d = entry->def;
  if (!d.gradient)
    fail<UnsupportedError>("[{}] custom op is not differentiable (it has no gradient builder)",
                           d.name);
  CustomGradContext g{d.name, c.attrs, c.inputs, c.outputs, c.cotangents};
  auto grads = d.gradient(g);
  if (grads.size() != c.inputs.size())
    fail<ValueError>("[{}] the gradient builder gave {} gradients for {} inputs", d.name,
                     grads.size(), c.inputs.size());
  return grads;
}

}  // namespace

Tensor CustomGradContext::cotangent_or_zeros(int i) const {
  if (cotangents.at(i)) return *cotangents[i];
  const Tensor& y = outputs.at(i);
  return zeros_like(y);
}

std::vector<Tensor> custom_op(const std::string& op, const std::vector<Tensor>& inputs,
                              const Attrs& attrs) {
  const auto entry = detail::find_custom_op(op);
  if (!entry) fail<ValueError>("[custom_op] no custom op is registered as '{}'", op);
  const CustomOpDef& d = entry->def;
  if (inputs.size() != d.inputs.size())
    fail<ValueError>("[{}] takes {} inputs, got {}", op, d.inputs.size(), inputs.size());
  for (const auto& kv : attrs.items()) {
    const std::string& k = kv.first;
    const AttrValue& v = kv.second;
    if (k.rfind("custom_", 0) == 0) continue;  // kiln's own (a gradient passes a node's attrs on)
    auto it = std::find_if(d.attrs.begin(), d.attrs.end(), [&](auto& a) { return a.first == k; });
    if (it == d.attrs.end()) fail<ValueError>("[{}] has no attribute '{}'", op, k);
    // an int is taken where a float is declared
    const bool widen = it->second.index() == 2 && v.index() == 1;
    if (it->second.index() != v.index() && !widen)
      fail<ValueError>("[{}] attribute '{}' is of type {}, got {}", op, k, attr_type(it->second),
                       attr_type(v));
  }
  Attrs all;
  all.set(kCustomOpKey, op);
  all.set(kCustomLibraryKey, d.library);
  for (const auto& kd : d.attrs) {
    const std::string& k = kd.first;  // (not a structured binding: lambdas capture it below)
    const AttrValue& dflt = kd.second;
    if (!attrs.has(k)) {
      all.set(k, dflt);
      continue;
    }
    const auto& given = *std::find_if(attrs.items().begin(), attrs.items().end(),
                                      [&](auto& a) { return a.first == k; });
    if (dflt.index() == 2 && given.second.index() == 1)
      all.set(k, static_cast<double>(std::get<int64_t>(given.second)));
    else
      all.set(k, given.second);
  }
  return detail::make_node(d.pure ? OpId::Custom : OpId::CustomImpure, inputs, std::move(all));
}

Tensor custom_op1(const std::string& op, const std::vector<Tensor>& inputs, const Attrs& attrs) {
  return custom_op(op, inputs, attrs)[0];
}

void register_custom_op_ops() {
  define_op(OpId::Custom).set_infer(infer_custom).grad(vjp_custom).variadic(1, INT_MAX);
  define_op(OpId::CustomImpure)
      .set_infer(infer_custom)
      .grad(vjp_custom)
      .impure()
      .variadic(1, INT_MAX);
}

}  // namespace kiln
