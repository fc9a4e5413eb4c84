// CUDA kernel of fused_elementwise: generates CUDA C++ for the program (src/ops/
// fused_elementwise.h; a group's parts in one kernel), compiles it with NVRTC to a cubin for the
// device's architecture, loads it with the driver API and launches it on the step's stream
// (nvrtc_cache.h: kernels cached by context and xxh3 of source and architecture, each compiled
// once). The generated source calls the
// functors of src/ops/elementwise_math.h, embedded as text, which the unfused kernels run too
// (f16/bf16 computed in f32 and rounded after every instruction), so a fused node gives what the
// unfused kernels give.
#include "backends/cuda/fused_elementwise.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/nvrtc_cache.h"
#include "core/errors.h"
#include "ops/elementwise_math.h"
#include "ops/elementwise_records.h"
#include "ops/fused_elementwise.h"

namespace kiln::cuda {

namespace {
constexpr int kRank = 8;  // broadcast dims after collapsing
constexpr int kBlock = 256;

// Kernel parameters; the generated source declares the same struct.
struct Params {
  const void* in[fused::kMaxInputs];
  void* out;
  long long n;
  int rank;
  int vec;
  int rowvec;  // vec chunks never cross a row of the innermost dim
  long long dims[kRank];
  long long strides[fused::kMaxInputs][kRank];
};

#include "ops/elementwise_math_text.inc"  // kElementwiseMathText: src/ops/elementwise_math.h

// Device code of every kernel: conversions of the stored types, then the ops' math
// (kElementwiseMathText, the functors the unfused kernels run).
const char* kPrelude = R"(
typedef long long i64; typedef unsigned long long u64;
template <class T> struct Lim;
#define KILN_LIM(T, L, H) template <> struct Lim<T> { static constexpr double lo = (double)(L), hi = (double)(H); static constexpr T bot = L, top = H; };
KILN_LIM(signed char, -128, 127) KILN_LIM(unsigned char, 0, 255) KILN_LIM(short, -32768, 32767)
KILN_LIM(unsigned short, 0, 65535) KILN_LIM(int, -2147483647 - 1, 2147483647)
KILN_LIM(unsigned int, 0, 4294967295u) KILN_LIM(i64, -9223372036854775807LL - 1, 9223372036854775807LL)
KILN_LIM(u64, 0, 18446744073709551615ULL)
#undef KILN_LIM
__device__ inline float h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ inline unsigned short f2h(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ inline float b2f(unsigned short b) { return __uint_as_float(((unsigned)b) << 16); }
__device__ inline unsigned short f2b(float f) {
#if __CUDA_ARCH__ >= 800
  unsigned short b; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f)); return b;
#else
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  u += 0x7fffu + ((u >> 16) & 1u); return (unsigned short)(u >> 16);
#endif
}
__device__ inline float rh(float f) { return h2f(f2h(f)); }
__device__ inline float rb(float f) { return b2f(f2b(f)); }
template <class D> __device__ inline D sat(double v) {
  if (!(v == v)) return D(0);
  if (v <= Lim<D>::lo) return Lim<D>::bot;
  if (v >= Lim<D>::hi) return Lim<D>::top;
  return (D)v;
}
// integer to integer (core/int_cast.h's saturate_int): exact within D's range, else its nearer end
template <class D, class S> __device__ inline D isat(S v) {
  if ((S)-1 < (S)0 && v < (S)0) {
    if ((D)-1 > (D)0) return D(0);
    return (i64)v < (i64)Lim<D>::bot ? Lim<D>::bot : (D)v;
  }
  return (u64)v > (u64)Lim<D>::top ? Lim<D>::top : (D)v;
}
)";

bool is_half(DType t) { return t == f16 || t == bf16; }
// C type a value is held in inside the kernel (half types as rounded float).
const char* ctype(DType t) {
  switch (t) {
    case f32:
    case f16:
    case bf16:
      return "float";
    case f64:
      return "double";
    case i8:
      return "signed char";
    case u8:
      return "unsigned char";
    case i16:
      return "short";
    case i32:
      return "int";
    case i64:
      return "long long";
    case u16:
      return "unsigned short";
    case u32:
      return "unsigned int";
    case u64:
      return "unsigned long long";
    case boolean:
      return "bool";
    default:  // (the narrow types never fuse: fusable_node)
      break;
  }
  return "float";
}
// C type of the stored element.
const char* stype(DType t) { return is_half(t) ? "unsigned short" : ctype(t); }
// Exact literal of a double in type `t`.
std::string lit(double v, const char* t) {
  int64_t bits;
  std::memcpy(&bits, &v, 8);
  return fmt::format("(({})__longlong_as_double({}LL))", t, bits);
}
// A bound of clip in the value type of `t`, as the unfused kernel computes it (math::clip_bound).
std::string clip_bound(DType t, double v, bool upper) {
  auto integer = [&](int64_t b) {  // INT64_MIN has no literal of its own
    return b == INT64_MIN ? fmt::format("(({})(-9223372036854775807LL - 1))", ctype(t))
                          : fmt::format("(({}){}LL)", ctype(t), b);
  };
  switch (t) {
    case i8: return integer(math::clip_bound<int8_t>(v, upper));
    case u8: return integer(math::clip_bound<uint8_t>(v, upper));
    case i16: return integer(math::clip_bound<int16_t>(v, upper));
    case i32: return integer(math::clip_bound<int32_t>(v, upper));
    case i64: return integer(math::clip_bound<int64_t>(v, upper));
    // (an unsigned bound past INT64_MAX wraps to a negative literal and back in the cast)
    case u16:
      return integer(math::clip_bound<uint16_t>(v, upper));
    case u32:
      return integer(math::clip_bound<uint32_t>(v, upper));
    case u64:
      return integer(static_cast<int64_t>(math::clip_bound<uint64_t>(v, upper)));
    default: return lit(v, ctype(t));
  }
}

// Expression loading input i at element index `idx` (dense) or offset `off`.
std::string load(DType t, const std::string& ptr) {
  if (t == f16) return "h2f(" + ptr + ")";
  if (t == bf16) return "b2f(" + ptr + ")";
  return ptr;
}

// The expression of one instruction over values v<k>: the op's functor of elementwise_math.h
// on the instruction's operand type A, with its attributes as the functor's members.
std::string expr(const fused::Instr& in, const std::vector<DType>& types) {
  const char* A = ctype(types[in.a]);
  auto v = [&](int j) { return fmt::format("v{}", in.operand(j)); };
  auto functor = [&](const char* name, const std::string& members) {
    std::string args = v(0);
    for (int j = 1; j < fused::arity(in.op); ++j) args += ", " + v(j);
    return fmt::format("kiln::math::{}<{}>{{{}}}({})", name, A, members, args);
  };
  if (const math::Record* r = math::record(in.op)) {
    std::string members;
    if (r->attr0) members = lit(in.p0, A);
    if (r->attr1) members += ", " + lit(in.p1, A);
    return functor(r->functor, members);
  }
  switch (in.op) {
    case OpId::Where:
      return fmt::format("({} ? {} : {})", v(0), v(1), v(2));
    case OpId::BitShift:
      return functor(in.p0 != 0 ? "ShiftLeft" : "ShiftRight", "");
    case OpId::Gelu:
      return functor(in.p0 != 0 ? "GeluTanh" : "Gelu", "");
    case OpId::Clip:
      return functor("Clip", clip_bound(types[in.a], in.p0, false) + ", " +
                                 clip_bound(types[in.a], in.p1, true));
    case OpId::Cast: {
      // as ew::convert_value: i64 -> i32 wraps; to half through float; to bool != 0; between
      // other integers saturating (exactly); to an integer from a float saturating from double;
      // floats through double
      const DType s = types[in.a], d = in.dtype;
      if (s == d || (is_half(s) && d == f32)) return v(0);
      if (s == i64 && d == i32) return "(int)" + v(0);
      if (is_integer(s) && is_integer(d)) return fmt::format("isat<{}>({})", ctype(d), v(0));
      if (d == boolean) return fmt::format("((double){} != 0)", v(0));
      if (is_half(d)) return fmt::format("(float)(double){}", v(0));
      if (d == f32 || d == f64) return fmt::format("({})(double){}", ctype(d), v(0));
      return fmt::format("sat<{}>((double){})", ctype(d), v(0));
    }
    default:
      break;
  }
  fail<UnsupportedError>("[fused_elementwise] no CUDA code for {}", op_name(in.op));
}

// Input layouts the source depends on: dense (numel of the output), a single value, or strided.
enum class Kind { dense, scalar, bcast };

std::string generate(const fused::Program& p, const std::vector<DType>& types, DType out,
                     const std::vector<Kind>& kind, int vec) {
  std::string s = kPrelude;
  s += kElementwiseMathText;
  s += fmt::format(
      "struct Params {{ const void* in[{}]; void* out; long long n; int rank; int vec; "
      "int rowvec; long long dims[{}]; long long strides[{}][{}]; }};\n",
      fused::kMaxInputs, kRank, fused::kMaxInputs, kRank);
  bool any_bcast = false;
  for (int k = 0; k < p.num_inputs; ++k) any_bcast = any_bcast || kind[k] == Kind::bcast;
  const int slots = std::max(p.num_inputs, 1);
  // the element offsets of the broadcast inputs at output index i
  s += "__device__ inline void offsets(const Params& p, long long i, long long* off) {\n";
  if (any_bcast) {
    for (int k = 0; k < p.num_inputs; ++k)
      if (kind[k] == Kind::bcast) s += fmt::format("  off[{}] = 0;\n", k);
    // 32-bit division while the index fits (64-bit division is emulated and slow)
    s += "  long long r = i;\n  for (int d = p.rank - 1; d >= 0; --d) {\n"
         "    const long long q = (r | p.dims[d]) <= 0x7fffffffLL\n"
         "        ? (long long)((unsigned)r / (unsigned)p.dims[d]) : r / p.dims[d];\n"
         "    const long long m = r - q * p.dims[d];\n";
    for (int k = 0; k < p.num_inputs; ++k)
      if (kind[k] == Kind::bcast) s += fmt::format("    off[{0}] += m * p.strides[{0}][d];\n", k);
    s += "    r = q;\n  }\n";
  }
  s += "}\n";
  // value of an element from its broadcast inputs' offsets, its dense inputs and the program
  s += "__device__ inline " + std::string(ctype(out)) +
       " elem(const Params& p, const long long* off";
  for (int k = 0; k < p.num_inputs; ++k)
    if (kind[k] == Kind::dense) s += fmt::format(", {} x{}", stype(types[k]), k);
  s += ") {\n";
  for (int k = 0; k < p.num_inputs; ++k) {
    const std::string ptr = fmt::format("((const {}*)p.in[{}])", stype(types[k]), k);
    const std::string e = kind[k] == Kind::dense    ? fmt::format("x{}", k)
                          : kind[k] == Kind::scalar ? ptr + "[0]"
                                                    : fmt::format("{}[off[{}]]", ptr, k);
    s += fmt::format("  const {} v{} = {};\n", ctype(types[k]), k, load(types[k], e));
  }
  for (size_t k = 0; k < p.instrs.size(); ++k) {
    const fused::Instr& in = p.instrs[k];
    const int v = p.num_inputs + static_cast<int>(k);
    std::string e = expr(in, types);
    if (in.dtype == f16)
      e = "rh(" + e + ")";
    else if (in.dtype == bf16)
      e = "rb(" + e + ")";
    else
      e = fmt::format("({})({})", ctype(in.dtype), e);
    s += fmt::format("  const {} v{} = {};\n", ctype(in.dtype), v, e);
  }
  s += fmt::format("  return v{};\n}}\n", p.num_values() - 1);
  const std::string store = out == f16 ? "f2h" : out == bf16 ? "f2b" : "";
  const std::string st = stype(out);
  // grid-stride loop, not unrolled (most launches give a thread one element or chunk, and an
  // unrolled loop's trip count and code slow a small launch); with p.vec every dense input and
  // the output move `vec` elements at a time
  // B-byte chunks for vector loads and stores
  s += "template <int B> struct alignas(B) Pk { unsigned char b[B]; };\n";
  s += "extern \"C\" __global__ void kiln_fused(Params p) {\n"
       "  const long long step = (long long)blockDim.x * gridDim.x;\n"
       "  const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
       "  long long start = 0;\n";
  if (vec > 1) {
    s += fmt::format("  if (p.vec) {{\n    const long long nv = p.n / {};\n", vec);
    s += "    #pragma unroll 1\n    for (long long j = t; j < nv; j += step) {\n";
    for (int k = 0; k < p.num_inputs; ++k)
      if (kind[k] == Kind::dense)
        s += fmt::format("      const Pk<{0}> a{1} = ((const Pk<{0}>*)p.in[{1}])[j];\n",
                         vec * size_of(types[k]), k);
    s += fmt::format("      Pk<{}> r;\n", vec * size_of(out));
    // p.rowvec: the chunk lies in one row of the innermost dim (its length a multiple of vec),
    // so the broadcast offsets come from one index decomposition a chunk, not one an element
    s += fmt::format("      long long ob[{0}], o[{0}];\n", slots);
    if (any_bcast) s += fmt::format("      if (p.rowvec) offsets(p, j * {}, ob);\n", vec);
    s += fmt::format("      for (int l = 0; l < {}; ++l) {{\n", vec);
    if (any_bcast) {
      s += "        if (p.rowvec) {\n";
      for (int k = 0; k < p.num_inputs; ++k)
        if (kind[k] == Kind::bcast)
          s += fmt::format("          o[{0}] = ob[{0}] + l * p.strides[{0}][p.rank - 1];\n", k);
      s += fmt::format("        }} else {{\n          offsets(p, j * {} + l, o);\n        }}\n",
                       vec);
    }
    s += fmt::format("        (({}*)r.b)[l] = {}(elem(p, o", st, store);
    for (int k = 0; k < p.num_inputs; ++k)
      if (kind[k] == Kind::dense) s += fmt::format(", ((const {}*)a{}.b)[l]", stype(types[k]), k);
    s += "));\n      }\n";
    s += fmt::format("      ((Pk<{}>*)p.out)[j] = r;\n    }}\n", vec * size_of(out));
    s += fmt::format("    start = nv * {};\n  }}\n", vec);
  }
  s += fmt::format(
      "  #pragma unroll 1\n  for (long long i = start + t; i < p.n; i += step) {{\n"
      "    long long o[{}];\n    offsets(p, i, o);\n",
      slots);
  s += fmt::format("    (({}*)p.out)[i] = {}(elem(p, o", st, store);
  for (int k = 0; k < p.num_inputs; ++k)
    if (kind[k] == Kind::dense) s += fmt::format(", ((const {}*)p.in[{}])[i]", stype(types[k]), k);
  s += "));\n  }\n}\n";
  return s;
}

// A group's kernel parameters (fused::is_group): part k's `size[k]` elements are threads
// first[k] to first[k] + size[k] of the grid, each part's first thread at a multiple of the warp
// (kWarp) so that no warp runs two parts' code one after the other.
constexpr int64_t kWarp = 32;
struct GroupParams {
  const void* in[fused::kMaxInputs];
  void* out[fused::kMaxParts];
  long long first[fused::kMaxParts];
  long long size[fused::kMaxParts];
};

// A group's kernel: one thread an element, every part in the one launch (GroupParams: the
// threads of a part). Each part reads its inputs as its output's elements (`dense`) or as one
// value (the fuse_elementwise pass groups no other). No grid-stride loop: its trip count and
// unrolled code cost a small group's launch a third of its time (a loop step of three values
// measured 2.12 us against 1.85 flat in a CUDA graph on an H100, and 1.46 for one part alone,
// before the parts were aligned to warps).
std::string generate_group(const std::vector<fused::Part>& parts,
                           const std::vector<DType>& in_types,
                           const std::vector<std::vector<Kind>>& kinds) {
  std::string s = kPrelude;
  s += kElementwiseMathText;
  s += fmt::format(
      "struct GroupParams {{ const void* in[{0}]; void* out[{1}]; long long first[{1}]; "
      "long long size[{1}]; }};\n",
      fused::kMaxInputs, fused::kMaxParts);
  for (size_t k = 0; k < parts.size(); ++k) {
    const fused::Part& part = parts[k];
    std::vector<DType> types;
    for (int32_t i : part.inputs) types.push_back(in_types[i]);
    types = fused::value_dtypes(part.program, types);
    const DType out = part.program.instrs.back().dtype;
    s += fmt::format("__device__ inline {} elem{}(const GroupParams& p, long long i) {{\n",
                     ctype(out), k);
    for (size_t q = 0; q < part.inputs.size(); ++q) {
      const std::string e = fmt::format("((const {}*)p.in[{}])[{}]", stype(types[q]),
                                        part.inputs[q], kinds[k][q] == Kind::dense ? "i" : "0");
      s += fmt::format("  const {} v{} = {};\n", ctype(types[q]), q, load(types[q], e));
    }
    for (size_t j = 0; j < part.program.instrs.size(); ++j) {
      const fused::Instr& in = part.program.instrs[j];
      std::string e = expr(in, types);
      e = in.dtype == f16    ? "rh(" + e + ")"
          : in.dtype == bf16 ? "rb(" + e + ")"
                             : fmt::format("({})({})", ctype(in.dtype), e);
      s += fmt::format("  const {} v{} = {};\n", ctype(in.dtype), part.program.num_inputs + j, e);
    }
    s += fmt::format("  return v{};\n}}\n", part.program.num_values() - 1);
  }
  s += "extern \"C\" __global__ void kiln_fused(GroupParams p) {\n"
       "  const long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n";
  for (size_t k = 0; k < parts.size(); ++k) {
    const DType out = parts[k].program.instrs.back().dtype;
    const std::string store = out == f16 ? "f2h" : out == bf16 ? "f2b" : "";
    const bool last = k + 1 == parts.size();
    s += k == 0 ? "  " : "  else ";
    if (!last) s += fmt::format("if (g < p.first[{}]) ", k + 1);
    s += fmt::format("{{\n    const long long i = g - p.first[{}];\n", k);
    s += fmt::format("    if (i < p.size[{0}]) (({1}*)p.out[{0}])[i] = {2}(elem{0}(p, i));\n  }}\n",
                     k, stype(out), store);
  }
  s += "}\n";
  return s;
}

// Output dims and per-input strides with size-1 dims dropped and mergeable dims merged.
bool collapse(const Shape& out, const std::vector<const Shape*>& ins, Params& p) {
  const int n = static_cast<int>(ins.size()), rank = static_cast<int>(out.size());
  std::vector<std::vector<int64_t>> st(n, std::vector<int64_t>(rank, 0));
  for (int k = 0; k < n; ++k) {
    const Shape& s = *ins[k];
    int64_t acc = 1;
    for (int d = static_cast<int>(s.size()) - 1; d >= 0; --d) {
      st[k][rank - static_cast<int>(s.size()) + d] = s[d] == 1 ? 0 : acc;
      acc *= s[d];
    }
  }
  p.rank = 0;
  for (int d = 0; d < rank; ++d) {
    if (out[d] == 1) continue;
    if (p.rank > 0) {
      bool merge = true;
      for (int k = 0; k < n; ++k) merge = merge && p.strides[k][p.rank - 1] == st[k][d] * out[d];
      if (merge) {
        p.dims[p.rank - 1] *= out[d];
        for (int k = 0; k < n; ++k) p.strides[k][p.rank - 1] = st[k][d];
        continue;
      }
    }
    if (p.rank == kRank) return false;
    p.dims[p.rank] = out[d];
    for (int k = 0; k < n; ++k) p.strides[k][p.rank] = st[k][d];
    ++p.rank;
  }
  return true;
}

struct Plan {
  std::string source;
  int vec = 1;
  std::vector<Kind> kind;
};

// How each input is read at these shapes: as the output's elements, as one value, or strided.
std::vector<Kind> kinds_of(const std::vector<TensorInfo>& ins, const TensorInfo& out) {
  const int64_t n = numel(out.shape);
  std::vector<Kind> kind;
  for (auto& t : ins) {
    const int64_t m = numel(t.shape);
    kind.push_back(m == n ? Kind::dense : m == 1 ? Kind::scalar : Kind::bcast);
  }
  return kind;
}

Plan plan(const Attrs& attrs, const std::vector<TensorInfo>& ins, const TensorInfo& out,
          const std::vector<Kind>& kind) {
  std::vector<DType> in_types;
  for (auto& t : ins) in_types.push_back(t.dtype);
  const fused::Program prog = fused::decode(attrs, in_types);
  const std::vector<DType> types = fused::value_dtypes(prog, in_types);
  Plan pl;
  pl.kind = kind;
  size_t widest = size_of(out.dtype);
  for (size_t k = 0; k < ins.size(); ++k)
    if (kind[k] == Kind::dense) widest = std::max(widest, size_of(ins[k].dtype));
  pl.vec = static_cast<int>(16 / widest);
  pl.source = generate(prog, types, out.dtype, pl.kind, pl.vec);
  return pl;
}

// Plans by the exact bytes of what they depend on (program attributes, input kinds and dtypes,
// output dtype), so runs skip decoding and code generation.
const Plan& cached_plan(const Attrs& attrs, const std::vector<TensorInfo>& ins,
                        const TensorInfo& out, const std::vector<Kind>& kind) {
  const auto& code = attrs.ints("code");
  const auto& params = attrs.floats("params");
  std::string key(reinterpret_cast<const char*>(code.data()), code.size() * sizeof(int64_t));
  key.append(reinterpret_cast<const char*>(params.data()), params.size() * sizeof(double));
  for (size_t k = 0; k < ins.size(); ++k) {
    key += static_cast<char>(ins[k].dtype);
    key += kind[k] == Kind::dense ? 'd' : kind[k] == Kind::scalar ? 's' : 'b';
  }
  key += static_cast<char>(out.dtype);
  static std::mutex mu;
  static auto* plans = new std::map<std::string, std::unique_ptr<const Plan>>();
  std::lock_guard<std::mutex> l(mu);
  auto& slot = (*plans)[key];
  if (!slot) slot = std::make_unique<const Plan>(plan(attrs, ins, out, kind));
  return *slot;
}

// Whether the binary of `pl` for the device is at hand (compiled before, or imported).
bool compiled_for(const Plan& pl, int device) {
  return nvrtc::has_binary(nvrtc::kernel_key(pl.source, nvrtc::device_arch(device)));
}

// The plan of a node of an executable of many shapes (KernelEnv::many_shapes). An input that is
// dense or one value at these shapes but has a dim of one, or fewer dims than the output, may be
// broadcast at others: a batch of one makes (1, s, d) as large as the output (b, s, d). When the
// kernel for these exact kinds is not compiled, a compiled one that reads some of those inputs
// with strides serves instead (the same values, bit for bit; fewest strided inputs first), so that
// a new shape compiles nothing an earlier shape compiled in another form.
const Plan& plan_of_many(const Attrs& attrs, const std::vector<TensorInfo>& ins,
                         const TensorInfo& out, int device) {
  const std::vector<Kind> exact = kinds_of(ins, out);
  const Plan& own = cached_plan(attrs, ins, out, exact);
  if (compiled_for(own, device)) return own;
  std::vector<size_t> loose;
  for (size_t k = 0; k < ins.size(); ++k) {
    const Shape& s = ins[k].shape;
    if (exact[k] != Kind::bcast &&
        (s.size() < out.shape.size() || std::find(s.begin(), s.end(), 1) != s.end()))
      loose.push_back(k);
  }
  constexpr size_t kMaxLoose = 4;  // (2^4 - 1 kernels looked up at most)
  if (loose.empty() || loose.size() > kMaxLoose) return own;
  for (int strided = 1; strided <= static_cast<int>(loose.size()); ++strided)
    for (unsigned mask = 1; mask < (1u << loose.size()); ++mask) {
      if (__builtin_popcount(mask) != strided) continue;
      std::vector<Kind> kind = exact;
      for (size_t j = 0; j < loose.size(); ++j)
        if (mask & (1u << j)) kind[loose[j]] = Kind::bcast;
      const Plan& other = cached_plan(attrs, ins, out, kind);
      if (compiled_for(other, device)) return other;
    }
  return own;
}

// A group's source for inputs of these dtypes and element counts (in(i): {dtype, numel}),
// cached by the exact bytes of what it depends on: the program's attributes, each input's dtype
// and whether it is one value (read as such) or of its part's size. Only a key not seen before
// decodes the program, so a run costs a key built in this thread's reused string and a lookup.
template <typename In>
const std::string& group_source(const Attrs& attrs, int num_inputs, In&& in) {
  thread_local std::string key;
  key.clear();
  for (const char* k : {"code", "parts", "part_inputs"}) {
    const auto& v = attrs.ints(k);
    key.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
    key += '|';
  }
  const auto& params = attrs.floats("params");
  key.append(reinterpret_cast<const char*>(params.data()), params.size() * sizeof(double));
  for (int i = 0; i < num_inputs; ++i) {
    const auto [dtype, count] = in(i);
    key += static_cast<char>(dtype);
    key += count == 1 ? 's' : 'd';
  }
  static std::mutex mu;
  static auto* sources = new std::map<std::string, std::string>();
  std::lock_guard<std::mutex> l(mu);
  if (auto it = sources->find(key); it != sources->end()) return it->second;
  std::vector<DType> in_types;
  for (int i = 0; i < num_inputs; ++i) in_types.push_back(in(i).first);
  const std::vector<fused::Part> parts = fused::decode_parts(attrs, in_types);
  std::vector<std::vector<Kind>> kinds;
  for (const fused::Part& part : parts) {
    int64_t n = 1;
    for (int32_t i : part.inputs) n = std::max(n, in(i).second);
    kinds.emplace_back();
    for (int32_t i : part.inputs) {
      const int64_t m = in(i).second;
      if (m != n && m != 1)
        fail<UnsupportedError>(
            "[fused_elementwise] a group's part reads an input of {} elements "
            "for an output of {} (only its own size or one value)",
            m, n);
      kinds.back().push_back(m == 1 ? Kind::scalar : Kind::dense);
    }
  }
  return sources->emplace(key, generate_group(parts, in_types, kinds)).first->second;
}
const std::string& group_source(const Attrs& attrs, const std::vector<TensorInfo>& ins) {
  return group_source(attrs, static_cast<int>(ins.size()), [&](int i) {
    return std::pair<DType, int64_t>{ins[i].dtype, numel(ins[i].shape)};
  });
}

const Plan& plan_for_node(const Attrs& attrs, const std::vector<TensorInfo>& ins,
                          const TensorInfo& out, int device, bool many_shapes) {
  return many_shapes ? plan_of_many(attrs, ins, out, device)
                     : cached_plan(attrs, ins, out, kinds_of(ins, out));
}

// The source of a node's kernel at these shapes (a group's, or a program's).
std::string source_for_node(const Attrs& attrs, const std::vector<TensorInfo>& ins,
                            const TensorInfo& out, int device, bool many_shapes) {
  if (fused::is_group(attrs)) return group_source(attrs, ins);
  return plan_for_node(attrs, ins, out, device, many_shapes).source;
}

void run_group(KernelContext& ctx) {
  auto stream = static_cast<CUstream>(ctx.stream());
  const std::string& src = group_source(ctx.attrs(), ctx.num_inputs(), [&](int i) {
    return std::pair<DType, int64_t>{ctx.in(i).dtype, ctx.in(i).numel()};
  });
  CUfunction fn = nvrtc::get_kernel(src, ctx.device(), stream);
  GroupParams p{};
  for (int i = 0; i < ctx.num_inputs(); ++i) p.in[i] = ctx.in(i).data;
  int64_t threads = 0, elements = 0;
  for (int k = 0; k < ctx.num_outputs(); ++k) {
    p.out[k] = ctx.out(k).data;
    p.first[k] = (threads + kWarp - 1) / kWarp * kWarp;
    p.size[k] = ctx.out(k).numel();
    threads = p.first[k] + p.size[k];
    elements += p.size[k];
  }
  if (elements == 0) return;
  const int64_t blocks = (threads + kBlock - 1) / kBlock;
  if (blocks > std::numeric_limits<int32_t>::max())
    fail<UnsupportedError>("[fused_elementwise] a group of {} elements is more than one launch",
                           elements);
  void* args[] = {&p};
  nvrtc::launch(fn, blocks, kBlock, stream, args);
}

void fused_elementwise(KernelContext& ctx) {
  if (fused::is_group(ctx.attrs())) return run_group(ctx);
  const TensorView& o = ctx.out(0);
  const int64_t n = o.numel();
  if (n == 0) return;
  std::vector<TensorInfo> ins;
  for (int i = 0; i < ctx.num_inputs(); ++i) ins.push_back({ctx.in(i).shape, ctx.in(i).dtype});
  const Plan& pl =
      plan_for_node(ctx.attrs(), ins, {o.shape, o.dtype}, ctx.device(), ctx.many_shapes());
  auto stream = static_cast<CUstream>(ctx.stream());
  CUfunction fn = nvrtc::get_kernel(pl.source, ctx.device(), stream);
  Params p{};
  std::vector<const Shape*> shapes;
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    p.in[i] = ctx.in(i).data;
    shapes.push_back(&ctx.in(i).shape);
  }
  p.out = o.data;
  p.n = n;
  if (!collapse(o.shape, shapes, p))
    fail<UnsupportedError>("[fused_elementwise] output shape {} broadcasts over more than {} dims",
                           str(o.shape), kRank);
  auto aligned = [&](const void* ptr, size_t es) {
    return reinterpret_cast<uintptr_t>(ptr) % (es * pl.vec) == 0;
  };
  bool vec = pl.vec > 1 && n >= 4096 && aligned(o.data, size_of(o.dtype));
  for (int i = 0; i < ctx.num_inputs(); ++i)
    if (pl.kind[i] == Kind::dense) vec = vec && aligned(ctx.in(i).data, size_of(ctx.in(i).dtype));
  p.vec = vec ? 1 : 0;
  p.rowvec = vec && p.rank > 0 && p.dims[p.rank - 1] % pl.vec == 0 ? 1 : 0;
  const int64_t items = vec ? n / pl.vec : n;
  const int64_t blocks =
      std::min<int64_t>(std::max<int64_t>((items + kBlock - 1) / kBlock, 1), 65535 * 8);
  void* args[] = {&p};
  nvrtc::launch(fn, blocks, kBlock, stream, args);
}
}  // namespace

namespace {
void prepare_fused_elementwise(const Attrs& attrs, const std::vector<TensorInfo>& ins,
                               const TensorInfo& out, int device, bool many_shapes) {
  if (!fused::is_group(attrs) && numel(out.shape) == 0) return;
  int previous = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&previous));
  KILN_CUDA_CHECK(cudaSetDevice(device));
  try {
    KILN_CUDA_CHECK(cudaFree(nullptr));  // makes the device's primary context current
    nvrtc::get_kernel(source_for_node(attrs, ins, out, device, many_shapes), device, nullptr);
  } catch (...) {
    cudaSetDevice(previous);
    throw;
  }
  KILN_CUDA_CHECK(cudaSetDevice(previous));
}
}  // namespace

std::string fused_elementwise_source(const Attrs& attrs, const std::vector<TensorInfo>& inputs,
                                     const TensorInfo& output) {
  if (fused::is_group(attrs)) return group_source(attrs, inputs);
  return plan(attrs, inputs, output, kinds_of(inputs, output)).source;
}
std::vector<char> fused_elementwise_cubin(const std::string& source, int arch) {
  return nvrtc::compile_cubin(source, arch);
}

std::vector<KernelBinary> export_fused_kernels(int device, const std::vector<KernelCall>& calls) {
  const int arch = nvrtc::device_arch(device);
  std::vector<KernelBinary> out;
  std::set<uint64_t> seen;
  for (const KernelCall& c : calls) {
    if (c.op != OpId::FusedElementwise || c.outputs.empty() ||
        (!fused::is_group(*c.attrs) && numel(c.outputs[0].shape) == 0))
      continue;
    const std::string src = fused_elementwise_source(*c.attrs, c.inputs, c.outputs[0]);
    const uint64_t key = nvrtc::kernel_key(src, arch);
    if (!seen.insert(key).second) continue;
    out.push_back({"sm_" + std::to_string(arch), key, *nvrtc::binary_for(src, arch, key)});
  }
  return out;
}

size_t import_fused_kernels(int device, const std::vector<KernelBinary>& bins) {
  const std::string arch = "sm_" + std::to_string(nvrtc::device_arch(device));
  size_t taken = 0;
  for (const KernelBinary& b : bins)
    if (b.arch == arch && !b.bytes.empty()) taken += nvrtc::add_binary(b.key, b.bytes);
  return taken;
}

void forget_fused_kernels() { nvrtc::forget(); }

int64_t fused_kernels_compiled() { return nvrtc::compiled(); }

void register_fused_elementwise_kernels() {
  register_kernel(OpId::FusedElementwise, Backend::cuda, {fused_elementwise, kAllTypes, -1, false});
  fused::set_prepare(Backend::cuda, prepare_fused_elementwise);
}

}  // namespace kiln::cuda
