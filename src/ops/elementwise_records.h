// The records of the elementwise ops (KILN_EW lines of src/ops/op_list.inc) as a constexpr
// table: what inference, the CPU and CUDA kernel tables, the fused kernels and the package
// validator derive from. Each record's math is the functor math::<PascalName> of
// src/ops/elementwise_math.h.
#pragma once

#include <cstdint>

#include "core/errors.h"
#include "core/op_id.h"
#include "core/op_params.h"
#include "kiln/attrs.h"
#include "kiln/dtype.h"

namespace kiln::math {

/// The result dtype: the input's, or bool.
enum class Result : uint8_t { same, boolean };
/// The input dtypes an op takes.
enum class Types : uint8_t { numeric, signed_numeric, floating, integer, boolean, all };

struct Record {
  OpId op;
  const char* functor;  // the functor's name in elementwise_math.h (the op's PascalName)
  int arity;        // 1 or 2
  Result result;
  Types types;
  const char* attr0;  // float attributes the functor takes in order, or nullptr
  const char* attr1;
  constexpr int num_attrs() const { return (attr0 ? 1 : 0) + (attr1 ? 1 : 0); }
};

constexpr DTypeSet dtypes(Types t) {
  switch (t) {
    case Types::numeric: return kNumericTypes;
    case Types::signed_numeric: return kSignedTypes;
    case Types::floating: return kFloatTypes;
    case Types::integer: return kIntTypes;
    case Types::boolean: return DTypeSet{boolean};
    case Types::all: return kAllTypes;
  }
  return {};
}

namespace record_tokens {  // the words of op_list.inc's KILN_EW columns
inline constexpr Result same = Result::same, boolean = Result::boolean;
inline constexpr Types numeric = Types::numeric, signed_ = Types::signed_numeric,
                       float_ = Types::floating, int_ = Types::integer, bool_ = Types::boolean,
                       all = Types::all;
constexpr const char* attr(const char* key) { return key[0] == '_' && key[1] == 0 ? nullptr : key; }
}  // namespace record_tokens

// KILN_EW's dtypes column spells C++ keywords (signed, float, int, bool); pasted onto `_` they
// name the constants above.
inline constexpr Record kRecords[] = {
#define KILN_OP(P, s, id, family)
#define KILN_EW(P, s, id, arity, result, types, k0, k1)                                       \
  {OpId::P, #P, arity, record_tokens::result, record_tokens::KILN_EW_TYPES_##types,               \
   record_tokens::attr(#k0), record_tokens::attr(#k1)},
#define KILN_EW_TYPES_numeric numeric
#define KILN_EW_TYPES_signed signed_
#define KILN_EW_TYPES_float float_
#define KILN_EW_TYPES_int int_
#define KILN_EW_TYPES_bool bool_
#define KILN_EW_TYPES_all all
#include "ops/op_list.inc"
#undef KILN_OP
#undef KILN_EW
};

/// The record of `op`, or nullptr when its math is not a single functor (where, cast, clip,
/// gelu, bit_shift and every op of another family).
constexpr const Record* record(OpId op) {
  for (const Record& r : kRecords)
    if (r.op == op) return &r;
  return nullptr;
}

/// The float attributes of a record with attributes, in the functor's order (the op's params).
struct RecordParams : OpParams {
  double a0 = 0, a1 = 0;
  /// Throws ValueError when the node lacks one, or holds one that is not a number.
  static RecordParams decode(OpId op, const Attrs& attrs) {
    const Record& r = *record(op);
    RecordParams p;
    if (r.attr0) p.a0 = attrs.f(r.attr0);
    if (r.attr1) p.a1 = attrs.f(r.attr1);
    return p;
  }
};

/// clip's bounds: min <= max, neither NaN (ValueError otherwise).
struct ClipParams : OpParams {
  double lo = 0, hi = 0;
  static ClipParams decode(OpId, const Attrs& attrs) {
    ClipParams p;
    p.lo = attrs.f("min");
    p.hi = attrs.f("max");
    if (!(p.lo <= p.hi))
      fail<ValueError>("[clip] needs min <= max, got min {} and max {}", p.lo, p.hi);
    return p;
  }
};

/// Calls f(attr0[, attr1]) with the float attributes of the kernel's record, for the kernels of
/// records whose functor takes NumAttrs members.
template <int NumAttrs, class F> void with_attrs(const KernelContext& ctx, F&& f) {
  if constexpr (NumAttrs == 0) {
    f();
  } else {
    const RecordParams p = params_of<RecordParams>(ctx);
    if constexpr (NumAttrs == 1) f(p.a0);
    else f(p.a0, p.a1);
  }
}

}  // namespace kiln::math

// KILN_EW_IF_NO_ATTRS(attr0, code...) expands to `code` for a record without attributes (attr0
// is `_`) and to nothing otherwise: the builders and Python bindings of records without
// attributes are generated; ops with attributes write theirs (defaults and checks). A record
// with a new attribute name adds it here.
#define KILN_EW_IF_NO_ATTRS(k0, ...) KILN_EW_NO_ATTRS_##k0(__VA_ARGS__)
#define KILN_EW_NO_ATTRS__(...) __VA_ARGS__
#define KILN_EW_NO_ATTRS_alpha(...)
#define KILN_EW_NO_ATTRS_beta(...)
#define KILN_EW_NO_ATTRS_lambda(...)
