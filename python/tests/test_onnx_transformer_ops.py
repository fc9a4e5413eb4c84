"""ONNX's transformer ops of opsets 23 and 24 (RMSNormalization, RotaryEmbedding, Attention,
Swish) imported by kiln and run beside ONNX Runtime on fresh random data. The models are built
with onnx.helper (the onnx package pinned for the conformance run predates these schemas, so
they are not checked by it; ONNX Runtime validates them)."""
import numpy as np
import pytest

import kiln

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

TYPES = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16,
         np.int64: TensorProto.INT64, np.bool_: TensorProto.BOOL}


def check(node, feeds, n_out=1, opset=23, rtol=1e-4, atol=1e-5, out_type=None):
    """Runs one node on `feeds` in ONNX Runtime and in kiln; compares every output (of the first
    feed's element type unless `out_type` says)."""
    ins = [helper.make_tensor_value_info(k, TYPES[v.dtype.type], v.shape) for k, v in feeds.items()]
    out_type = out_type or TYPES[next(iter(feeds.values())).dtype.type]
    outs = [helper.make_tensor_value_info(f"y{i}", out_type, None) for i in range(n_out)]
    node.output[:] = [f"y{i}" for i in range(n_out)]
    model = helper.make_model(helper.make_graph([node], "g", ins, outs),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)
    exe = kiln.onnx.load_bytes(model.SerializeToString()).compile(device="cpu")
    got = exe.run(feeds)
    assert len(got) == n_out
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy().astype(np.float64), w.astype(np.float64), rtol=rtol,
                                   atol=atol)


def randn(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("axis, scale_shape", [(-1, (8,)), (1, (3, 8)), (-1, (1,))])
def test_rms_normalization(rng, axis, scale_shape):
    feeds = {"x": randn(rng, 2, 3, 8), "s": randn(rng, *scale_shape)}
    check(helper.make_node("RMSNormalization", ["x", "s"], ["y"], axis=axis, epsilon=1e-4), feeds)


def test_rms_normalization_f16_computes_in_f32(rng):
    feeds = {"x": randn(rng, 4, 16, dtype=np.float16), "s": randn(rng, 16, dtype=np.float16)}
    check(helper.make_node("RMSNormalization", ["x", "s"], ["y"]), feeds, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rd", [0, 4])
def test_rotary_embedding_4d_with_position_ids(rng, interleaved, rd):
    half = (rd or 8) // 2
    feeds = {"x": randn(rng, 2, 3, 5, 8), "cos": randn(rng, 16, half), "sin": randn(rng, 16, half),
             "pos": rng.integers(0, 16, (2, 5)).astype(np.int64)}
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"],
                            interleaved=interleaved, rotary_embedding_dim=rd)
    check(node, feeds)


def test_rotary_embedding_3d_with_caches_per_token(rng):
    feeds = {"x": randn(rng, 2, 5, 4 * 6), "cos": randn(rng, 2, 5, 3), "sin": randn(rng, 2, 5, 3)}
    check(helper.make_node("RotaryEmbedding", ["x", "cos", "sin"], ["y"], num_heads=4), feeds)


@pytest.mark.parametrize("opset", [23, 24])
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_4d(rng, opset, causal):
    feeds = {"q": randn(rng, 2, 4, 5, 8), "k": randn(rng, 2, 4, 5, 8), "v": randn(rng, 2, 4, 5, 6)}
    check(helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=causal), feeds,
          opset=opset)


def test_attention_3d_grouped_heads_with_masks(rng):
    q, k, v = randn(rng, 2, 5, 8 * 4), randn(rng, 2, 7, 2 * 4), randn(rng, 2, 7, 2 * 4)
    node = lambda ins: helper.make_node("Attention", ins, ["y"], q_num_heads=8,  # noqa: E731
                                        kv_num_heads=2, scale=0.3)
    check(node(["q", "k", "v"]), {"q": q, "k": k, "v": v})
    keep = rng.random((5, 7)) < 0.7
    keep[:, 0] = True
    check(node(["q", "k", "v", "m"]), {"q": q, "k": k, "v": v, "m": keep})
    check(node(["q", "k", "v", "m"]), {"q": q, "k": k, "v": v, "m": randn(rng, 2, 1, 5, 7)})


def test_attention_with_past_keys_returns_present(rng):
    feeds = {"q": randn(rng, 1, 4, 2, 8), "k": randn(rng, 1, 2, 2, 8), "v": randn(rng, 1, 2, 2, 8),
             "pk": randn(rng, 1, 2, 6, 8), "pv": randn(rng, 1, 2, 6, 8)}
    node = helper.make_node("Attention", ["q", "k", "v", "", "pk", "pv"], ["y"])
    check(node, feeds, n_out=3)


@pytest.mark.parametrize("alpha", [1.0, 1.7])
def test_swish(rng, alpha):
    check(helper.make_node("Swish", ["x"], ["y"], alpha=alpha), {"x": randn(rng, 3, 7)}, opset=24)


def test_what_is_not_mapped_fails_naming_it(rng):
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], softcap=30.0)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT,
                                                                      [1, 2, 3, 4])
                                        for n in "qkv"],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)])
    with pytest.raises(kiln.UnsupportedError, match="softcap"):
        kiln.onnx.load_bytes(model.SerializeToString())
    # a schema that changed after opset 21 without a mapping of the change stays refused
    node = helper.make_node("DequantizeLinear", ["q", "s"], ["y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("q", TensorProto.INT8, [2]),
                                        helper.make_tensor_value_info("s", TensorProto.FLOAT, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)])
    with pytest.raises(kiln.UnsupportedError, match="DequantizeLinear"):
        kiln.onnx.load_bytes(model.SerializeToString())


def test_cast_of_opset_24(rng):
    x = randn(rng, 3, 5) * 100
    check(helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT16), {"x": x}, opset=24,
          rtol=1e-3, out_type=TensorProto.FLOAT16)
    node = helper.make_node("CastLike", ["x", "l"], ["y"])
    check(node, {"x": x, "l": np.zeros(1, np.float16)}, opset=24, rtol=1e-3,
          out_type=TensorProto.FLOAT16)


def test_attention_causal_with_past_keys(rng):
    feeds = {"q": randn(rng, 1, 2, 3, 8), "k": randn(rng, 1, 2, 3, 8), "v": randn(rng, 1, 2, 3, 8),
             "pk": randn(rng, 1, 2, 4, 8), "pv": randn(rng, 1, 2, 4, 8)}
    node = helper.make_node("Attention", ["q", "k", "v", "", "pk", "pv"], ["y"], is_causal=1)
    check(node, feeds, n_out=3)
    feeds["m"] = randn(rng, 1, 1, 3, 7)  # a float mask added inside the triangle
    node = helper.make_node("Attention", ["q", "k", "v", "m", "pk", "pv"], ["y"], is_causal=1)
    check(node, feeds, n_out=3)


@pytest.mark.parametrize("mode", ["linear", "circular"])
@pytest.mark.parametrize("axis", [-2, 2])
def test_tensor_scatter(rng, mode, axis):
    past = randn(rng, 3, 2, 8, 4)
    update = randn(rng, 3, 2, 3, 4)
    hi = 8 if mode == "circular" else 6
    w = rng.integers(0, hi, 3).astype(np.int64)
    node = helper.make_node("TensorScatter", ["p", "u", "w"], ["y"], axis=axis, mode=mode)
    check(node, {"p": past, "u": update, "w": w}, opset=24)
    node = helper.make_node("TensorScatter", ["p", "u"], ["y"], axis=axis, mode=mode)
    check(node, {"p": past, "u": update}, opset=24)
