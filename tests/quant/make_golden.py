"""Writes the numpy references of tests/quant/test_quant_golden.cpp into tests/quant/data/.

numpy is the reference: quantize is rint(x / scale) (round half to even, in x's dtype) plus the
zero point, clipped to the integer range (NaN to the low end); dequantize is
(q as f32 - zp as f32) * scale. Run from the repository root: python tests/quant/make_golden.py
"""
import os

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
RANGES = {np.int8: (-128, 127), np.uint8: (0, 255), np.int16: (-32768, 32767)}


def expand(v, x_shape, axis, block):
    """A scale or zero point spread to x's shape."""
    if v.ndim == 0:
        return v
    if block == 0:
        shape = [1] * len(x_shape)
        shape[axis] = -1
        return v.reshape(shape)
    return np.repeat(v, block, axis=axis).take(np.arange(x_shape[axis]), axis=axis)


def quantize(x, s, zp, axis, block):
    lo, hi = RANGES[zp.dtype.type]
    q = np.rint(x / expand(s, x.shape, axis, block)).astype(np.float64)
    q = q + expand(zp, x.shape, axis, block).astype(np.float64)
    return np.where(np.isnan(q), lo, np.clip(q, lo, hi)).astype(zp.dtype)


def dequantize(q, s, zp, axis, block):
    d = q.astype(np.float32) - expand(zp, q.shape, axis, block).astype(np.float32)
    return d * expand(s, q.shape, axis, block)


def save(name, **arrays):
    for k, v in arrays.items():
        np.save(os.path.join(OUT, f"{name}_{k}.npy"), v)


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(20261130)
    # per tensor, ties: multiples of 0.125 with scale 0.25 divide exactly to halves
    x = (np.arange(-40, 41, dtype=np.float32) * 0.125).astype(np.float32)
    save("ties", x=x, scale=np.float32(0.25), zp=np.int8(0),
         q=quantize(x, np.float32(0.25), np.int8(0), 0, 0))
    # per tensor u8 with saturation, NaN and infinities
    x = np.concatenate([rng.uniform(-8, 8, 200).astype(np.float32),
                        np.array([np.nan, np.inf, -np.inf, 1e30, -1e30], np.float32)])
    s, zp = np.float32(0.037), np.uint8(117)
    save("u8", x=x, scale=s, zp=zp, q=quantize(x, s, zp, 0, 0))
    # per channel along axis 1 of (4, 5, 3), i8 with zero points
    x = rng.normal(0, 2, (4, 5, 3)).astype(np.float32)
    s = rng.uniform(0.01, 0.1, 5).astype(np.float32)
    zp = rng.integers(-20, 20, 5).astype(np.int8)
    q = quantize(x, s, zp, 1, 0)
    save("channel", x=x, scale=s, zp=zp, q=q, dq=dequantize(q, s, zp, 1, 0))
    # per group: (6, 10) in blocks of 4 along axis 1 (the last block holds 2), i16
    x = rng.normal(0, 50, (6, 10)).astype(np.float32)
    s = rng.uniform(0.001, 0.01, (6, 3)).astype(np.float32)
    zp = rng.integers(-100, 100, (6, 3)).astype(np.int16)
    q = quantize(x, s, zp, 1, 4)
    save("group", x=x, scale=s, zp=zp, q=q, dq=dequantize(q, s, zp, 1, 4))
    qdq_matmul_model()


def qdq_matmul_model():
    """A QDQ ONNX model: quantize x, int8 per-channel weights, MatMul, Add bias, Relu, quantize."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    k, n = 32, 24
    w = rng.normal(0, 0.1, (k, n)).astype(np.float32)
    sw = (np.abs(w).max(0) / 127).astype(np.float32)
    inits = {"sx": np.array(4 / 255, np.float32), "zx": np.array(128, np.uint8),
             "wq": np.clip(np.rint(w / sw), -127, 127).astype(np.int8), "sw": sw,
             "zw": np.zeros(n, np.int8), "b": rng.normal(0, 0.1, n).astype(np.float32),
             "sy": np.array(0.01, np.float32), "zy": np.array(3, np.uint8)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"], axis=1),
             helper.make_node("MatMul", ["xd", "wd"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "sy", "zy"], ["y"])]
    graph = helper.make_graph(
        nodes, "qdq_matmul", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, k])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [8, n])],
        [numpy_helper.from_array(v, name) for name, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, os.path.join(OUT, "qdq_matmul.onnx"))


if __name__ == "__main__":
    main()
