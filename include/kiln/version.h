#pragma once
#define KILN_VERSION "0.1.0"
namespace kiln {
/// "0.1.0"
const char* version();
}  // namespace kiln
