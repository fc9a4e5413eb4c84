// Helpers to throw kiln errors with fmt formatting. Messages start with "[op]".
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kiln/error.h"
#include "kiln/shape.h"

namespace kiln {

template <typename E, typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw E(fmt::format(f, std::forward<Args>(args)...));
}

/// "(2, 3)" for messages.
inline std::string str(const Shape& s) { return to_string(s); }

}  // namespace kiln
