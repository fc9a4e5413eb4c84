#include <cstdio>
#include <cstdlib>

#include "kiln/error.h"
#include "kiln/version.h"

namespace kiln {

const char* version() { return KILN_VERSION; }

namespace detail {
void assert_fail(const char* expr, const char* file, int line) {
  std::fprintf(stderr, "kiln internal error: KILN_ASSERT(%s) failed at %s:%d\n", expr, file, line);
  std::abort();
}
}  // namespace detail
}  // namespace kiln
