// Symbolic dims: the dims of a dynamic program as expressions of its inputs' dims ("batch",
// "seq", "batch*seq", "(h+2-3)//2+1"), so that compile passes can compare dims whose values are
// only known when a feed arrives.
//
// A dim is an int64: >= 0 a size, -1 (kDynamic) unknown, and a symbolic dim is a code far below
// zero that names an interned expression (sym::is_symbolic). Any other negative value reads as
// unknown, so arithmetic that an inference did on a code without these helpers never passes for
// another expression. Codes live in memory only: packages and the public API see -1 (sym::erase).
// Two equal codes are equal expressions, and so equal sizes at run time; two different codes may
// still be equal at run time (passes treat them as different: they only lose an optimization).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "kiln/shape.h"

namespace kiln::sym {

/// Whether d names an interned expression.
bool is_symbolic(int64_t d);
/// Whether d is a size (>= 0).
inline bool is_size(int64_t d) { return d >= 0; }

/// The dim named `name` (the same code for the same name).
int64_t symbol(const std::string& name);
/// Expressions of dims, folded when the operands are sizes; any unknown operand gives unknown.
int64_t add(int64_t a, int64_t b);
int64_t sub(int64_t a, int64_t b);  // (a - b, which shapes use only where it is >= 0)
int64_t mul(int64_t a, int64_t b);
int64_t floordiv(int64_t a, int64_t b);  // b > 0
int64_t ceildiv(int64_t a, int64_t b);   // b > 0
int64_t min(int64_t a, int64_t b);
int64_t max(int64_t a, int64_t b);
/// The product of dims (1 for none).
int64_t product(const Shape& s, size_t begin = 0, size_t end = SIZE_MAX);

/// The size of d when each symbol takes value(name) (-1 for a name without a value); -1 when d
/// is unknown or an operand is.
int64_t evaluate(int64_t d, const std::function<int64_t(const std::string&)>& value);
/// d with each min and max replaced by the operand that is chosen when each symbol takes
/// value(name) (on a tie, a symbolic operand): the dims of the shapes seen first, where a program
/// that assumed them checks every shape against them (passes/program.h instantiate).
int64_t choose(int64_t d, const std::function<int64_t(const std::string&)>& value);
/// "batch*seq", "7", "?".
std::string str(int64_t d);
/// "(batch, seq*12, 64)".
std::string str(const Shape& s);
/// The shape with its symbolic dims made unknown (-1), for what leaves the compiler.
Shape erase(const Shape& s);

}  // namespace kiln::sym
