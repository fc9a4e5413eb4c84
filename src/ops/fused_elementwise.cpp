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
  // bitcast reinterprets bytes, which no functor of a fused kernel does
  if (std::strcmp(op_family(op), "elementwise") != 0 || op == OpId::Bitcast) return 0;
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

Attrs encode_group(const std::vector<Part>& parts) {
  Program all;
  std::vector<int64_t> sizes, inputs;
  for (const Part& part : parts) {
    sizes.insert(sizes.end(), {static_cast<int64_t>(part.inputs.size()),
                               static_cast<int64_t>(part.program.instrs.size())});
    inputs.insert(inputs.end(), part.inputs.begin(), part.inputs.end());
    all.instrs.insert(all.instrs.end(), part.program.instrs.begin(), part.program.instrs.end());
  }
  Attrs a = encode(all);
  a.set("parts", sizes);
  a.set("part_inputs", inputs);
  return a;
}

bool is_group(const Attrs& attrs) { return attrs.has("parts"); }

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

namespace {
// The parts' instruction ranges and inputs a group's attributes give (checked against the
// instruction count and the node's input count); one part over all inputs where it is no group.
std::vector<Decoded::Range> ranges(const Attrs& attrs, size_t num_instrs, size_t num_inputs) {
  if (!is_group(attrs)) return {{0, num_instrs, {}}};
  const std::vector<int64_t>& sizes = attrs.ints("parts");
  const std::vector<int64_t>& inputs =
      attrs.has("part_inputs") ? attrs.ints("part_inputs") : std::vector<int64_t>{};
  if (sizes.empty() || sizes.size() % 2 || sizes.size() / 2 > static_cast<size_t>(kMaxParts))
    fail<ValueError>(
        "[fused_elementwise] parts must hold 2 ints per part for 1 to {} parts, got {}", kMaxParts,
        sizes.size());
  std::vector<Decoded::Range> out;
  size_t instr = 0, in = 0;
  for (size_t k = 0; k < sizes.size() / 2; ++k) {
    const int64_t n_in = sizes[2 * k], n_instr = sizes[2 * k + 1];
    if (n_in < 1 || n_in > kMaxInputs || n_instr < 1 ||
        n_instr > static_cast<int64_t>(num_instrs - instr) ||
        n_in > static_cast<int64_t>(inputs.size() - in))
      fail<ValueError>(
          "[fused_elementwise] part {} takes {} inputs and {} instructions, beyond "
          "what the node holds",
          k, n_in, n_instr);
    Decoded::Range r{instr, static_cast<size_t>(n_instr), {}};
    for (int64_t j = 0; j < n_in; ++j) {
      const int64_t i = inputs[in + j];
      if (i < 0 || i >= static_cast<int64_t>(num_inputs))
        fail<ValueError>("[fused_elementwise] part {} reads input {} of {}", k, i, num_inputs);
      r.inputs.push_back(static_cast<int32_t>(i));
    }
    instr += n_instr;
    in += n_in;
    out.push_back(std::move(r));
  }
  if (instr != num_instrs || in != inputs.size())
    fail<ValueError>(
        "[fused_elementwise] the parts hold {} instructions and {} inputs of the "
        "{} and {} encoded",
        instr, in, num_instrs, inputs.size());
  return out;
}

// Checks one program's instructions against its input dtypes.
void check_program(const Program& p, const std::vector<DType>& input_dtypes);
}  // namespace

std::vector<Part> decode_parts(const Attrs& attrs, const std::vector<DType>& input_dtypes) {
  if (input_dtypes.empty() || input_dtypes.size() > static_cast<size_t>(kMaxInputs))
    fail<ValueError>("[fused_elementwise] takes 1 to {} inputs, got {}", kMaxInputs,
                     input_dtypes.size());
  const std::vector<Instr> instrs = parse(attrs);
  std::vector<Part> parts;
  for (const Decoded::Range& r : ranges(attrs, instrs.size(), input_dtypes.size())) {
    Part part;
    std::vector<DType> types;
    if (r.inputs.empty()) {
      types = input_dtypes;
      for (size_t i = 0; i < input_dtypes.size(); ++i)
        part.inputs.push_back(static_cast<int32_t>(i));
    } else {
      part.inputs = r.inputs;
      for (int32_t i : r.inputs) types.push_back(input_dtypes[i]);
    }
    part.program.num_inputs = static_cast<int>(types.size());
    part.program.instrs.assign(instrs.begin() + static_cast<std::ptrdiff_t>(r.first),
                               instrs.begin() + static_cast<std::ptrdiff_t>(r.first + r.count));
    try {
      check_program(part.program, types);
    } catch (const ValueError& e) {
      if (!is_group(attrs)) throw;
      fail<ValueError>("[fused_elementwise] part {}: {}", parts.size(), e.what());
    }
    parts.push_back(std::move(part));
  }
  return parts;
}

Program decode(const Attrs& attrs, const std::vector<DType>& input_dtypes) {
  if (is_group(attrs))
    fail<ValueError>("[fused_elementwise] a group of parts is no single program");
  return decode_parts(attrs, input_dtypes).at(0).program;
}

namespace {
void check_program(const Program& p, const std::vector<DType>& input_dtypes) {
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
}
}  // namespace

Decoded Decoded::decode(OpId, const Attrs& attrs) {
  Decoded d;
  d.instrs = parse(attrs);
  for (const Instr& in : d.instrs) d.attrs.push_back(op_attrs(in));
  // (the input count is checked by inference; any count will do here)
  d.parts = ranges(attrs, d.instrs.size(), kMaxInputs);
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
  if (!fused::is_group(ctx.attrs)) {
    const fused::Program p = fused::decode(ctx.attrs, types);
    return {{ops::broadcast_infer(ctx), p.instrs.back().dtype}};
  }
  // a group: each part's output of its own inputs' broadcast shape
  std::vector<TensorInfo> out;
  for (const fused::Part& part : fused::decode_parts(ctx.attrs, types)) {
    std::vector<TensorInfo> ins;
    for (int32_t i : part.inputs) ins.push_back(ctx.inputs[i]);
    const InferContext sub{ctx.op, ctx.attrs, ins};
    out.push_back({ops::broadcast_infer(sub), part.program.instrs.back().dtype});
  }
  return out;
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
