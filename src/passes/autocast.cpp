// Autocast (mixed precision): matrix products, convolutions and attention whose inputs are f32 run
// in a low float precision (f16 or bf16) between casts, and hand f32 back to their readers, so
// every other op (reductions, softmax, norms, losses, elementwise) and every variable stays f32.
// Which ops run low is a fact of each op's OpDef (low_precision(), set in src/ops/<family>.cpp).
#include <map>

#include "core/errors.h"
#include "core/op_registry.h"
#include "passes/program.h"

namespace kiln {

using detail::Node;
using detail::ValueRef;

namespace {
// The ops that gain from low precision (OpDef::autocast_low: the products, convolutions and
// attention, whose bool mask stays bool), when their inputs are f32.
bool runs_low(const Node& n, const detail::GraphImpl& g) {
  const OpDef& def = op_def(n.op);
  if (!def.autocast_low) return false;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const DType t = g.info(n.inputs[i]).dtype;
    if (t != f32 && !(static_cast<int>(i) == def.autocast_bool_input && t == boolean)) return false;
  }
  return true;
}

class Autocaster {
 public:
  Autocaster(const Program& p, DType low) : src_(p), b_(p), low_(low) {}

  Program run() {
    for (size_t i = 0; i < src_.graph.nodes.size(); ++i) {
      const auto id = static_cast<int32_t>(i);
      if (runs_low(src_.graph.nodes[i], src_.graph))
        cast_node(id);
      else
        b_.copy(id);
    }
    return b_.finish();
  }

 private:
  // Copies the node with its inputs in low precision and maps its outputs to f32 casts.
  void cast_node(int32_t id) {
    Node n = src_.graph.nodes[id];
    for (auto& v : n.inputs)
      v = src_.graph.info(v).dtype == f32 ? to_low(b_.remap(v)) : b_.remap(v);
    const int32_t nid = b_.graph().add(n.op, n.inputs, n.attrs, n.name);
    b_.graph().nodes[nid].origin = n.origin;
    std::vector<ValueRef> outs;
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      const ValueRef low{nid, static_cast<int32_t>(k)};
      const ValueRef back = cast(low, f32);
      low_of_[back] = low;  // a low-precision reader takes `low` itself, not a second cast
      outs.push_back(back);
    }
    b_.map(id, std::move(outs));
  }

  // The low-precision copy of f32 value `v` of the new program, made once per value.
  ValueRef to_low(ValueRef v) {
    auto it = low_of_.find(v);
    if (it != low_of_.end()) return it->second;
    const ValueRef low = cast(v, low_);
    low_of_[v] = low;
    return low;
  }

  ValueRef cast(ValueRef v, DType t) {
    return {b_.graph().add(OpId::Cast, {v}, {{"dtype", t}}), 0};
  }

  const Program& src_;
  ProgramBuilder b_;
  DType low_;
  std::map<ValueRef, ValueRef> low_of_;  // f32 value -> its low-precision twin
};
}  // namespace

Program autocast(const Program& p, DType low) {
  if (low != f16 && low != bf16)
    fail<ValueError>("[autocast] low precision must be f16 or bf16, got {}", name(low));
  return Autocaster(p, low).run();
}

}  // namespace kiln
