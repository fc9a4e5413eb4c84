// An op library that registers test.softshrink again (ops_lib.cpp has it) and a new op: loading
// it after ops_lib must fail and register neither.
#include "kiln/custom_op.h"

KILN_OP_LIBRARY(r) {
  for (const char* name : {"test.dup_fresh", "test.softshrink"}) {
    kiln::CustomOpDef d;
    d.name = name;
    d.inputs = {{"x"}};
    d.outputs = {{"y"}};
    r.register_op(d);
  }
}
