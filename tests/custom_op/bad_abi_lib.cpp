// An op library that claims another op ABI version: load_op_library must refuse it.
#include "kiln/custom_op.h"

extern "C" __attribute__((visibility("default"))) int kiln_op_abi_version() {
  return KILN_OP_ABI_VERSION + 1000;
}
extern "C" __attribute__((visibility("default"))) void kiln_register_ops(
    kiln::OpLibraryRegistrar&) {}
