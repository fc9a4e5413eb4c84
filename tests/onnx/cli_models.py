"""Tiny ONNX models shared by the CLI tests (test_cli.py, test_cli_package.py)."""
import numpy as np
from onnx import TensorProto, helper, numpy_helper


def gather_where(rng):
    """Y = where(C, gather(T, I), 0): int64 indices and a bool input, n rows. Returns (model, T)."""
    t = rng.standard_normal((4, 5)).astype(np.float32)
    zero = np.zeros((), np.float32)
    nodes = [helper.make_node("Gather", ["T", "I"], ["G"], axis=0),
             helper.make_node("Where", ["C", "G", "zero"], ["Y"])]
    g = helper.make_graph(nodes, "gw", [helper.make_tensor_value_info("I", TensorProto.INT64, ["n"]),
                                        helper.make_tensor_value_info("C", TensorProto.BOOL, ["n", 5])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n", 5])],
                          [numpy_helper.from_array(t, "T"), numpy_helper.from_array(zero, "zero")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m, t
