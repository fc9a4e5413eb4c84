#include "core/op_registry.h"

#include <fmt/format.h>

#include <array>
#include <mutex>

#include "core/errors.h"

namespace kiln {

namespace {
struct NameEntry {
  const char* snake = nullptr;
  const char* pascal = nullptr;
  const char* family = nullptr;
};

const std::array<NameEntry, kOpIdLimit>& names() {
  static const std::array<NameEntry, kOpIdLimit> t = [] {
    std::array<NameEntry, kOpIdLimit> a{};
#define KILN_OP(Name, snake, id, fam) a[id] = {#snake, #Name, #fam};
#include "ops/op_list.inc"
#undef KILN_OP
    return a;
  }();
  return t;
}

std::array<OpDef, kOpIdLimit>& defs_storage() {
  static std::array<OpDef, kOpIdLimit> d{};
  return d;
}
}  // namespace

const char* op_name(OpId op) {
  const char* n = names()[static_cast<int>(op)].snake;
  return n ? n : "unknown_op";
}
const char* op_pascal_name(OpId op) {
  const char* n = names()[static_cast<int>(op)].pascal;
  return n ? n : "UnknownOp";
}
const char* op_family(OpId op) {
  const char* n = names()[static_cast<int>(op)].family;
  return n ? n : "";
}
const std::vector<OpId>& all_ops() {
  static const std::vector<OpId> ops(std::begin(kAllOps), std::end(kAllOps));
  return ops;
}
bool op_from_name(std::string_view name, OpId& out) {
  for (OpId op : kAllOps)
    if (name == op_name(op)) {
      out = op;
      return true;
    }
  return false;
}

bool OpDef::input_range(const Attrs& attrs, int& lo, int& hi) const {
  if (min_inputs < 0) return false;
  int more = 0;
  for (const char* key : optional_input_keys) more += attrs.b(key, false) ? 1 : 0;
  if (extra_inputs) more += extra_inputs(attrs);
  if (attrs.b("from_values", false)) more += static_cast<int>(value_attrs.size());
  lo = min_inputs + more;
  hi = max_inputs + more;
  return true;
}

std::string stored::check_ints(const Attrs& a, const char* key, size_t want, int64_t lo,
                               int64_t hi) {
  if (!a.has(key)) return {};
  const auto& v = a.ints(key);
  if (v.size() != want)
    return fmt::format("attribute {} has {} values; {} expected", key, v.size(), want);
  for (int64_t e : v)
    if (e < lo || e > hi)
      return fmt::format("attribute {} holds {}, outside [{}, {}]", key, e, lo, hi);
  return {};
}

OpDef& define_op(OpId op) {
  OpDef& d = defs_storage()[static_cast<int>(op)];
  d.id = op;
  return d;
}

const OpDef& op_def(OpId op) {
  static std::once_flag once;
  std::call_once(once, [] {
    register_core_ops();
    register_elementwise_ops();
    register_linalg_ops();
    register_conv_ops();
    register_pool_ops();
    register_reduce_ops();
    register_norm_ops();
    register_transform_ops();
    register_loss_ops();
    register_dist_ops();
    register_random_ops();
    register_fused_elementwise_ops();
    register_rnn_ops();
    register_attention_ops();
    register_factorization_ops();
    register_quant_ops();
    register_custom_op_ops();
    register_control_ops();
  });
  return defs_storage()[static_cast<int>(op)];
}

Layout layout_of(OpId op, const Attrs& attrs) {
  return op_def(op).nhwc_input && attrs.b("channels_last", false) ? Layout::channels_last
                                                                  : Layout::plain;
}

std::vector<TensorInfo> infer_node(const InferContext& ctx) {
  const OpDef& def = op_def(ctx.op);
  if (!def.infer) fail<UnsupportedError>("[{}] op has no shape inference", ctx.name());
  if (layout_of(ctx.op, ctx.attrs) == Layout::plain) return def.infer(ctx);
  if (def.infer_channels_last) return def.infer_channels_last(ctx);
  // the plain inference on NCHW (and OIHW) views of the NHWC inputs (and OHWI weight), its 4-D
  // outputs permuted to NHWC
  const int n = static_cast<int>(ctx.inputs.size());
  std::vector<TensorInfo> in = ctx.inputs;
  for (int k = 0; k < n; ++k) {
    Shape& s = in[k].shape;
    if (!def.nhwc_input(ctx.attrs, k, n) && k != def.khwc_weight_input) continue;
    if (s.size() != 4)
      fail<ShapeError>("[{}] channels_last takes a 4-D (N, H, W, C) input {}, got shape {}",
                       ctx.name(), k, str(s));
    s = {s[0], s[3], s[1], s[2]};
  }
  Attrs attrs = ctx.attrs;
  attrs.set("channels_last", false);
  std::vector<TensorInfo> out = def.infer(InferContext{ctx.op, attrs, in, ctx.bodies});
  for (TensorInfo& t : out)
    if (t.shape.size() == 4) t.shape = {t.shape[0], t.shape[2], t.shape[3], t.shape[1]};
  return out;
}

}  // namespace kiln
