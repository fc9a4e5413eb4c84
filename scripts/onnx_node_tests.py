#!/usr/bin/env python3
"""Writes ONNX's backend node tests from the onnx package's own case definitions
(onnx/backend/test/case/node): one directory per case with model.onnx and test_data_set_*/
{input,output}_*.pb, the layout of onnx/backend/test/data/node, which onnx's wheels no longer
ship. numpy's global generator is seeded, so a given onnx version always writes the same data.

    .venv/bin/python scripts/onnx_node_tests.py OUT_DIR     # writes OUT_DIR/node/<case>/...

A file OUT_DIR/VERSION holds the onnx version written, so that a build regenerates the data
only when the pinned onnx changes.
"""
import os
import shutil
import sys
import warnings

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper


def proto_of(value, info):
    t = info.type
    if t.HasField("sequence_type"):
        return numpy_helper.from_list(value, info.name)
    if t.HasField("optional_type"):
        return numpy_helper.from_optional(value, info.name)
    if t.HasField("map_type"):
        return numpy_helper.from_dict(value, info.name)
    if isinstance(value, TensorProto):
        return value
    return numpy_helper.from_array(value, info.name)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = os.path.join(sys.argv[1], "node")
    stamp = os.path.join(sys.argv[1], "VERSION")
    if os.path.exists(stamp) and open(stamp).read().strip() == onnx.__version__:
        return
    np.random.seed(0)
    import onnx.backend.test.case.node as node_cases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the cases' own numpy warnings (divisions by zero)
        cases = node_cases.collect_testcases()
    shutil.rmtree(out, ignore_errors=True)
    for case in cases:
        d = os.path.join(out, case.name)
        os.makedirs(d)
        with open(os.path.join(d, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        for i, (inputs, outputs) in enumerate(case.data_sets):
            ds = os.path.join(d, f"test_data_set_{i}")
            os.makedirs(ds)
            for prefix, values, infos in (("input", inputs, case.model.graph.input),
                                          ("output", outputs, case.model.graph.output)):
                for j, v in enumerate(values):
                    with open(os.path.join(ds, f"{prefix}_{j}.pb"), "wb") as f:
                        f.write(proto_of(v, infos[j]).SerializeToString())
    with open(stamp, "w") as f:
        f.write(onnx.__version__ + "\n")
    print(f"onnx {onnx.__version__}: {len(cases)} node test cases in {out}")


if __name__ == "__main__":
    main()
