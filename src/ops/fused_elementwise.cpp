// The fused_elementwise op: program encoding, validation and shape inference (format in
// src/ops/fused_elementwise.h).
#include "ops/fused_elementwise.h"

#include <cmath>
#include <cstring>

#include "ops/common.h"
#include "ops/elementwise_records.h"

namespace kiln::fused {

namespace {
// The attribute keys carried in p0/p1, per op (nullptr: none).
struct ParamKeys {
  const char* k0 = nullptr;
  const char* k1 = nullptr;
};
ParamKeys param_keys(OpId op) {
  if (const math::Record* r = math::record(op)) return {r->attr0, r->attr1};
  if (op == OpId::Clip) return {"min", "max"};
  return {};  // gelu and bit_shift carry theirs as flags (pack_params)
}

[[noreturn]] void bad(size_t k, const std::string& why) {
  fail<ValueError>("[fused_elementwise] instruction {}: {}", k, why);
}
}  // namespace

int arity(OpId op) {
  if (std::strcmp(op_family(op), "elementwise") != 0) return 0;
  if (const math::Record* r = math::record(op)) return r->arity;
  if (op == OpId::Where) return 3;
  return op == OpId::BitShift ? 2 : 1;  // cast, clip, gelu: 1
}

bool pack_params(OpId op, const Attrs& attrs, Instr& out) {
  out.p0 = out.p1 = 0;
  if (op == OpId::Gelu) {
    out.p0 = attrs.str("approximate") == "tanh" ? 1 : 0;
    return true;
  }
  if (op == OpId::BitShift) {
    out.p0 = attrs.b("left") ? 1 : 0;
    return true;
  }
  const ParamKeys k = param_keys(op);
  if (k.k0) out.p0 = attrs.f(k.k0);
  if (k.k1) out.p1 = attrs.f(k.k1);
  return std::isfinite(out.p0) && std::isfinite(out.p1);
}

Attrs op_attrs(const Instr& in) {
  Attrs a;
  if (in.op == OpId::Gelu)
    a.set("approximate", std::string(in.p0 != 0 ? "tanh" : "none"));
  else if (in.op == OpId::BitShift)
    a.set("left", in.p0 != 0);
  else if (in.op == OpId::Cast)
    a.set("dtype", in.dtype);
  const ParamKeys k = param_keys(in.op);
  if (k.k0) a.set(k.k0, in.p0);
  if (k.k1) a.set(k.k1, in.p1);
  return a;
}

Attrs encode(const Program& p) {
  std::vector<int64_t> code;
  std::vector<double> params;
  for (const Instr& in : p.instrs) {
    code.insert(code.end(),
                {static_cast<int64_t>(in.op), static_cast<int64_t>(in.dtype), in.a, in.b, in.c});
    params.insert(params.end(), {in.p0, in.p1});
  }
  Attrs a;
  a.set("code", code);
  a.set("params", params);
  return a;
}

namespace {
// The instructions the attributes encode, with the checks that need no input dtypes: the sizes of
// code and params, each op a fusable elementwise op, each dtype one of kiln's.
std::vector<Instr> parse(const Attrs& attrs) {
  const std::vector<int64_t>& code = attrs.ints("code");
  const std::vector<double>& params = attrs.floats("params");
  if (code.empty() || code.size() % 5 != 0 || code.size() / 5 > kMaxInstrs)
    fail<ValueError>(
        "[fused_elementwise] code must hold 5 ints per instruction for 1 to {} "
        "instructions, got {} ints",
        kMaxInstrs, code.size());
  const size_t n = code.size() / 5;
  if (params.size() != 2 * n)
    fail<ValueError>("[fused_elementwise] params must hold 2 floats per instruction ({}), got {}",
                     2 * n, params.size());
  std::vector<Instr> instrs;
  for (size_t k = 0; k < n; ++k) {
    const int64_t* c = &code[5 * k];
    if (c[0] <= 0 || c[0] >= kOpIdLimit) bad(k, fmt::format("op id {} is out of range", c[0]));
    Instr in;
    in.op = static_cast<OpId>(c[0]);
    if (std::strcmp(op_name(in.op), "unknown_op") == 0 || arity(in.op) == 0)
      bad(k, fmt::format("op id {} ({}) is not a fusable elementwise op", c[0], op_name(in.op)));
    if (c[1] < 0 || c[1] >= kNumDTypes) bad(k, fmt::format("dtype {} is out of range", c[1]));
    in.dtype = static_cast<DType>(c[1]);
    in.a = static_cast<int32_t>(c[2]);
    in.b = static_cast<int32_t>(c[3]);
    in.c = static_cast<int32_t>(c[4]);
    in.p0 = params[2 * k];
    in.p1 = params[2 * k + 1];
    instrs.push_back(in);
  }
  return instrs;
}
}  // namespace

Program decode(const Attrs& attrs, const std::vector<DType>& input_dtypes) {
  Program p;
  p.num_inputs = static_cast<int>(input_dtypes.size());
  if (p.num_inputs < 1 || p.num_inputs > kMaxInputs)
    fail<ValueError>("[fused_elementwise] takes 1 to {} inputs, got {}", kMaxInputs, p.num_inputs);
  p.instrs = parse(attrs);
  std::vector<DType> types = input_dtypes;
  for (size_t k = 0; k < p.instrs.size(); ++k) {
    const Instr& in = p.instrs[k];
    const int ar = arity(in.op);
    const int64_t defined = p.num_inputs + static_cast<int64_t>(k);
    std::vector<TensorInfo> operands;
    for (int j = 0; j < 3; ++j) {
      const int64_t v = in.operand(j);
      if (j < ar) {
        if (v < 0 || v >= defined)
          bad(k, fmt::format("{} operand {} reads value %{}, not defined before it (%0..%{})",
                             op_name(in.op), j, v, defined - 1));
        operands.push_back({Shape{}, types[v]});
      } else if (v != -1) {
        bad(k,
            fmt::format("{} takes {} operands, but operand {} is %{}", op_name(in.op), ar, j, v));
      }
    }
    if ((in.op == OpId::Gelu || in.op == OpId::BitShift) && in.p0 != 0 && in.p0 != 1)
      bad(k, fmt::format("{} takes a flag of 0 or 1, got {}", op_name(in.op), in.p0));
    // each instruction must pass its op's own inference, giving the recorded dtype
    std::vector<TensorInfo> out;
    try {
      const Attrs a = op_attrs(in);
      out = op_def(in.op).infer(InferContext{in.op, a, operands});
    } catch (const Error& e) {
      bad(k, e.what());
    }
    if (out.size() != 1 || out[0].dtype != in.dtype)
      bad(k, fmt::format("{} gives {}, but the program records {}", op_name(in.op),
                         out.empty() ? "nothing" : name(out[0].dtype), name(in.dtype)));
    types.push_back(in.dtype);
  }
  return p;
}

Decoded Decoded::decode(OpId, const Attrs& attrs) {
  Decoded d;
  d.instrs = parse(attrs);
  for (const Instr& in : d.instrs) d.attrs.push_back(op_attrs(in));
  return d;
}

std::vector<DType> value_dtypes(const Program& p, const std::vector<DType>& input_dtypes) {
  std::vector<DType> t = input_dtypes;
  for (const Instr& in : p.instrs) t.push_back(in.dtype);
  return t;
}

std::string text(const Program& p, const std::vector<DType>& input_dtypes) {
  std::string s;
  for (size_t i = 0; i < input_dtypes.size(); ++i)
    s += fmt::format("%{} = input.{}; ", i, name(input_dtypes[i]));
  for (size_t k = 0; k < p.instrs.size(); ++k) {
    const Instr& in = p.instrs[k];
    s += fmt::format("%{} = {}.{}(", p.num_inputs + k, op_name(in.op), name(in.dtype));
    for (int j = 0; j < arity(in.op); ++j) s += fmt::format("{}%{}", j ? ", " : "", in.operand(j));
    const Attrs a = op_attrs(in);
    if (!a.items().empty() && in.op != OpId::Cast) s += "; " + a.to_string();
    s += "); ";
  }
  return s;
}

namespace {
PrepareFn g_prepare[kNumBackends] = {};
}  // namespace
void set_prepare(Backend backend, PrepareFn fn) { g_prepare[static_cast<int>(backend)] = fn; }
PrepareFn prepare(Backend backend) { return g_prepare[static_cast<int>(backend)]; }

}  // namespace kiln::fused

namespace kiln {

namespace {
std::vector<TensorInfo> infer_fused(const InferContext& ctx) {
  std::vector<DType> types;
  for (const auto& t : ctx.inputs) types.push_back(t.dtype);
  const fused::Program p = fused::decode(ctx.attrs, types);
  return {{ops::broadcast_infer(ctx), p.instrs.back().dtype}};
}
}  // namespace

// Built after autodiff (by a compile pass), so it needs no gradient rule.
void register_fused_elementwise_ops() {
  define_op(OpId::FusedElementwise)
      .set_infer(infer_fused)
      .not_differentiable()
      .variadic(1, 32)
      .params<fused::Decoded>();
}

}  // namespace kiln
