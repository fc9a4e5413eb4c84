// MIL ops mapped onto kiln's (src/io/coreml/mil.h).
#include "io/coreml/mil.h"

namespace kiln::coreml::detail {

void add_control_ops(OpTable& t) { (void)t; }

}  // namespace kiln::coreml::detail
