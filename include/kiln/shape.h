// Shapes: dims as int64, -1 meaning "unknown until compile".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

using Shape = std::vector<int64_t>;
inline constexpr int64_t kDynamic = -1;

/// Product of dims (1 for a scalar); -1 if any dim is dynamic.
int64_t numel(const Shape& s);
/// True when no dim is -1.
bool is_static(const Shape& s);
/// "(2, 3, 4)"; dynamic dims print as "?".
std::string to_string(const Shape& s);
/// Row-major strides in elements.
std::vector<int64_t> contiguous_strides(const Shape& s);
/// numpy broadcasting of two shapes; returns false when they do not broadcast.
bool broadcast_shapes(const Shape& a, const Shape& b, Shape& out);
/// Resolves a possibly negative axis against rank; returns -1 when out of range.
int normalize_axis(int64_t axis, int rank);

}  // namespace kiln
