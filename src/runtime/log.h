// kiln's log: messages to stderr at or above KILN_LOG's level (runtime/env_vars.inc).
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <utility>

namespace kiln::log {

enum class Level : int { error = 0, warn = 1, info = 2, debug = 3 };

/// KILN_LOG's level: error when unset or unknown (read at every call, which only log sites make).
Level level();

/// Whether messages at `l` are printed.
inline bool on(Level l) { return static_cast<int>(l) <= static_cast<int>(level()); }

/// Prints the message and a newline to stderr when `l` is on.
template <typename... A> void print(Level l, fmt::format_string<A...> f, A&&... args) {
  if (!on(l)) return;
  std::string line = fmt::format(f, std::forward<A>(args)...);
  line += '\n';
  std::fputs(line.c_str(), stderr);
}

template <typename... A> void warn(fmt::format_string<A...> f, A&&... args) {
  print(Level::warn, f, std::forward<A>(args)...);
}
template <typename... A> void info(fmt::format_string<A...> f, A&&... args) {
  print(Level::info, f, std::forward<A>(args)...);
}

}  // namespace kiln::log
