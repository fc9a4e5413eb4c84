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
    qdq_conv_model()
    qlinear_conv_model()


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



def qdq_conv_model():
    """A QDQ ONNX model with two convolutions of one quantized x (2, 4, 10, 10): int8 per-channel
    weights, a float bias, padding, Relu (y1); int8 per-tensor weights in 2 groups, stride 2,
    asymmetric pads, an int32 bias through DequantizeLinear, Add of a residual input (y2)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(11)
    w1 = rng.normal(0, 0.1, (6, 4, 3, 3)).astype(np.float32)
    sw1 = (np.abs(w1).reshape(6, -1).max(1) / 127).astype(np.float32)
    w2 = rng.normal(0, 0.1, (4, 2, 3, 3)).astype(np.float32)
    sw2 = np.array(np.abs(w2).max() / 127, np.float32)
    sx = np.array(4 / 255, np.float32)
    inits = {"sx": sx, "zx": np.array(128, np.uint8),
             "w1q": np.clip(np.rint(w1 / sw1.reshape(6, 1, 1, 1)), -127, 127).astype(np.int8),
             "sw1": sw1, "zw1": np.zeros(6, np.int8), "b1": rng.normal(0, 0.2, 6).astype(np.float32),
             "w2q": np.clip(np.rint(w2 / sw2), -127, 127).astype(np.int8), "sw2": sw2,
             "zw2": np.array(0, np.int8),
             "b2q": rng.integers(-300, 300, 4).astype(np.int32),
             "sb2": np.array(sx * sw2, np.float32), "zb2": np.array(0, np.int32),
             "sy1": np.array(0.01, np.float32), "zy1": np.array(3, np.uint8),
             "sy2": np.array(0.02, np.float32), "zy2": np.array(-5, np.int8)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w1q", "sw1", "zw1"], ["w1d"], axis=0),
             helper.make_node("Conv", ["xd", "w1d", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("QuantizeLinear", ["r1", "sy1", "zy1"], ["y1"]),
             helper.make_node("DequantizeLinear", ["w2q", "sw2", "zw2"], ["w2d"]),
             helper.make_node("DequantizeLinear", ["b2q", "sb2", "zb2"], ["b2d"]),
             helper.make_node("Conv", ["xd", "w2d", "b2d"], ["c2"], group=2, strides=[2, 2],
                              pads=[0, 1, 1, 0]),
             helper.make_node("Add", ["c2", "res"], ["a2"]),
             helper.make_node("QuantizeLinear", ["a2", "sy2", "zy2"], ["y2"])]
    graph = helper.make_graph(
        nodes, "qdq_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 10, 10]),
         helper.make_tensor_value_info("res", TensorProto.FLOAT, [2, 4, 5, 5])],
        [helper.make_tensor_value_info("y1", TensorProto.UINT8, [2, 6, 10, 10]),
         helper.make_tensor_value_info("y2", TensorProto.INT8, [2, 4, 5, 5])],
        [numpy_helper.from_array(v, name) for name, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, os.path.join(OUT, "qdq_conv.onnx"))


def qlinear_conv_model():
    """A QLinearConv model (u8 x, per-channel int8 weights with an int32 bias, stride 2, asymmetric
    pads) and its output from onnx's reference evaluator for a random x."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(13)
    inits = {"sx": np.array(0.02, np.float32), "zx": np.array(120, np.uint8),
             "w": rng.integers(-127, 128, (5, 3, 3, 2)).astype(np.int8),
             "sw": rng.uniform(0.002, 0.01, 5).astype(np.float32), "zw": np.zeros(5, np.int8),
             "sy": np.array(0.05, np.float32), "zy": np.array(131, np.uint8),
             "b": rng.integers(-3000, 3000, 5).astype(np.int32)}
    node = helper.make_node("QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "b"],
                            ["y"], strides=[2, 1], pads=[1, 0, 0, 1])
    graph = helper.make_graph(
        [node], "qlinear_conv", [helper.make_tensor_value_info("x", TensorProto.UINT8, [2, 3, 9, 8])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        [numpy_helper.from_array(v, name) for name, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, os.path.join(OUT, "qlinear_conv.onnx"))
    # the spec's definition in integers (onnx's reference evaluator mis-broadcasts per-channel
    # w_scale): (conv(x - x_zp, w - w_zp) + b) * (x_scale * w_scale / y_scale), the multiplier
    # in f32, rounded half to even, plus y_zp, saturated
    x = rng.integers(0, 256, (2, 3, 9, 8)).astype(np.uint8)
    xp = np.pad(x.astype(np.int64) - 120, ((0, 0), (0, 0), (1, 0), (0, 1)))
    w = inits["w"].astype(np.int64)
    oh, ow = (xp.shape[2] - 3) // 2 + 1, xp.shape[3] - 2 + 1
    acc = np.zeros((2, 5, oh, ow), np.int64)
    for i in range(oh):
        for j in range(ow):
            win = xp[:, :, 2 * i:2 * i + 3, j:j + 2]
            acc[:, :, i, j] = np.einsum("nchw,ochw->no", win, w)
    acc += inits["b"].reshape(1, 5, 1, 1)
    m = (inits["sx"] * inits["sw"] / inits["sy"]).astype(np.float32).astype(np.float64)
    y = np.rint(acc * m.reshape(1, 5, 1, 1)) + 131
    save("qlinear_conv", x=x, y=np.clip(y, 0, 255).astype(np.uint8))


if __name__ == "__main__":
    main()
