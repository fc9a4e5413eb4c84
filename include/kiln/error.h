// Every user-facing failure of kiln is a kiln::Error. Messages start with "[op or component]".
#pragma once

#include <stdexcept>
#include <string>

namespace kiln {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
/// Shapes that do not fit together (or do not match a placeholder at run time).
class ShapeError : public Error { public: using Error::Error; };
/// A dtype an op does not take, or inputs of dtypes that do not mix.
class DTypeError : public Error { public: using Error::Error; };
/// Something kiln does not do (yet): a dtype without kernel, a device without backend.
class UnsupportedError : public Error { public: using Error::Error; };
/// A file that cannot be read or written.
class IoError : public Error { public: using Error::Error; };
/// A file whose contents are malformed.
class FormatError : public Error { public: using Error::Error; };
/// A device allocation that failed even after freeing caches.
class OutOfMemory : public Error { public: using Error::Error; };
/// A device or driver failure.
class DeviceError : public Error { public: using Error::Error; };
/// Bad arguments that are not about shapes or dtypes (bad axis, bad attribute value, ...).
class ValueError : public Error { public: using Error::Error; };

}  // namespace kiln

/// Internal invariant check, on in release builds. Failing one is a kiln bug.
#define KILN_ASSERT(cond)                                                         \
  do {                                                                            \
    if (!(cond)) ::kiln::detail::assert_fail(#cond, __FILE__, __LINE__);          \
  } while (0)

namespace kiln::detail {
[[noreturn]] void assert_fail(const char* expr, const char* file, int line);
}
