// MIL's control flow mapped onto kiln's control ops (include/kiln/ops/control.h;
// src/io/coreml/mil.h): `cond` as kiln's cond (or, with a predicate known while importing, the
// taken branch mapped in place), `while_loop` as kiln's while_loop over the loop variables. The
// nested blocks become the bodies: a block reads the values of the blocks around it by name and
// kiln captures them. List ops (make_list, list_write, ...) are not mapped.
#include "io/coreml/mil.h"
#include "kiln/ops/control.h"
#include "kiln/ops/core.h"
#include "kiln/ops/elementwise.h"

namespace kiln::coreml::detail {

namespace {

[[noreturn]] void unsupported(const OpContext& c, const std::string& why) {
  kiln::fail<UnsupportedError>("[coreml] {}: {}", c.where(), why);
}

// Whether two shapes can be the same (an unknown dim matches any).
bool compatible(const Shape& a, const Shape& b) {
  if (a.size() != b.size()) return false;
  for (size_t d = 0; d < a.size(); ++d)
    if (a[d] >= 0 && b[d] >= 0 && a[d] != b[d]) return false;
  return true;
}

// A predicate as one bool.
Tensor as_bool(const Tensor& t) { return t.dtype() == boolean ? t : cast(t, boolean); }

// cond(pred): blocks[0] (true_fn) when pred holds, else blocks[1] (false_fn); neither takes
// inputs, both give the op's outputs.
void cond_op(OpContext& c) {
  if (c.num_blocks() != 2)
    c.fail("has {} nested blocks, not two (true_fn, false_fn)", c.num_blocks());
  for (int k = 0; k < 2; ++k)
    if (c.nested(k).outputs_size() != c.num_outputs())
      c.fail("nested block {} gives {} values for {} outputs", k, c.nested(k).outputs_size(),
             c.num_outputs());
  if (c.is_known("pred")) {
    const Array p = c.known("pred");
    if (p.numel() != 1) c.fail("the predicate has shape {}, not one value", str(p.shape()));
    c.inline_block(p.astype(boolean).data<bool>()[0] ? 0 : 1);
    return;
  }
  const Tensor pred = as_bool(c.in("pred"));
  // the branches give the op's declared dtypes; their shapes must match (kiln's cond gives
  // values of one shape whichever branch runs)
  std::vector<Shape> first;
  auto branch = [&c, &first](int k) {
    return [&c, &first, k](const std::vector<Tensor>&) {
      std::vector<Tensor> out = c.block(k, {});
      for (size_t j = 0; j < out.size(); ++j) {
        const DType want = c.out_dtype(static_cast<int>(j));
        if (out[j].dtype() != want) out[j] = cast(out[j], want);
      }
      if (first.empty()) {
        for (const Tensor& t : out) first.push_back(t.shape());
      } else {
        for (size_t j = 0; j < out.size(); ++j)
          if (!compatible(first[j], out[j].shape()))
            unsupported(c, fmt::format("output {} has shape {} in one branch and {} in the other "
                                       "(kiln's cond gives one shape)",
                                       j, str(first[j]), str(out[j].shape())));
      }
      return out;
    };
  };
  c.set(cond(pred, {}, branch(0), branch(1)));
}

// while_loop(loop_vars): while blocks[0](vars) (one bool), vars = blocks[1](vars); both blocks
// take the loop variables as their inputs.
void while_loop_op(OpContext& c) {
  if (c.num_blocks() != 2)
    c.fail("has {} nested blocks, not two (the condition, the body)", c.num_blocks());
  std::vector<Tensor> init = c.ins("loop_vars");
  const mil::Block& cond_block = c.nested(0);
  const mil::Block& body = c.nested(1);
  const int n = static_cast<int>(init.size());
  if (cond_block.inputs_size() != n || body.inputs_size() != n)
    c.fail("has {} loop variables; its condition takes {} and its body {}", n,
           cond_block.inputs_size(), body.inputs_size());
  if (cond_block.outputs_size() != 1)
    c.fail("its condition gives {} values, not one", cond_block.outputs_size());
  if (body.outputs_size() != n || c.num_outputs() != n)
    c.fail("has {} loop variables; its body gives {} and the op {}", n, body.outputs_size(),
           c.num_outputs());
  // the loop variables in the body's declared dtypes
  for (int k = 0; k < n; ++k) {
    const auto& type = body.inputs(k).type();
    if (!type.has_tensortype()) unsupported(c, fmt::format("loop variable {} is not a tensor", k));
    const DType want = dtype_of(type.tensortype().datatype(), c.where());
    if (init[k].dtype() != want) init[k] = cast(init[k], want);
  }
  auto cond_fn = [&c](const std::vector<Tensor>& v) {
    return std::vector<Tensor>{as_bool(c.block(0, v)[0])};
  };
  auto body_fn = [&c, &body](const std::vector<Tensor>& v) {
    std::vector<Tensor> out = c.block(1, v);
    for (size_t k = 0; k < out.size(); ++k) {
      if (out[k].dtype() != v[k].dtype()) out[k] = cast(out[k], v[k].dtype());
      if (!compatible(out[k].shape(), v[k].shape()))
        unsupported(c, fmt::format("loop variable {} ('{}') goes from shape {} to {} in the "
                                   "body; kiln's while_loop carries values of fixed shapes",
                                   k, body.inputs(static_cast<int>(k)).name(), str(v[k].shape()),
                                   str(out[k].shape())));
    }
    return out;
  };
  c.set(while_loop(init, cond_fn, body_fn));
}

}  // namespace

void add_control_ops(OpTable& t) {
  t["cond"] = cond_op;
  t["while_loop"] = while_loop_op;
}

}  // namespace kiln::coreml::detail
