// Small helpers for tests of compiled programs: counting an executable's steps of one op, and
// setting an environment variable that compiling reads (KILN_CHANNELS_LAST, ...) for a scope.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

#include "kiln/kiln.h"

namespace kiln::test {

/// How many steps of `exe` run op `op` (by name, e.g. "quantized_conv").
inline int count_steps(const Executable& exe, const std::string& op) {
  int c = 0;
  for (const auto& s : exe.placement()) c += s.op == op;
  return c;
}

/// Sets an environment variable for a scope; restores (or unsets) it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace kiln::test
