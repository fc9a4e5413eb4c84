"""ONNX's transformer ops of opsets 23 to 27 (RMSNormalization, RotaryEmbedding, Attention,
Swish, CausalConvWithState) imported by kiln and run beside ONNX Runtime on fresh random data, and Attention's
features ONNX Runtime computes otherwise (the causal alignment) or not at all beside a float64
reference of the operator's definition; and the other mappings the newest node tests brought
(DFT's inverse of a onesided spectrum, Col2Im, CumProd) against numpy. The models are built
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


def run_kiln(node, feeds, n_out, opset):
    """One node imported and run by kiln alone (outputs as float64 arrays)."""
    ins = [helper.make_tensor_value_info(k, TYPES[v.dtype.type], v.shape) for k, v in feeds.items()]
    outs = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(n_out)]
    names = [f"y{i}" if i < n_out else "" for i in range(4)]
    node.output[:] = names[:max(n_out, 1)] if n_out < 4 else names
    model = helper.make_model(helper.make_graph([node], "g", ins, outs),
                              opset_imports=[helper.make_opsetid("", opset)])
    exe = kiln.onnx.load_bytes(model.SerializeToString()).compile(device="cpu")
    return [g.numpy().astype(np.float64) for g in exe.run(feeds)]


def attention_reference(q, k, v, mask=None, nonpad=None, causal=False, softcap=0.0, mode=None,
                        left=-1, right=-1):
    """Attention of 4-D q (B, H, L, E) over k, v (B, H, S, E) as the ONNX operator defines it
    (onnx/reference/ops/op_attention.py), in float64: the causal frontier and the window aligned
    at nonpad - L per batch (0 without it), a mask shorter than the keys padded with -inf, rows
    that see no key zeros. Returns Y and the qk_matmul_output of `mode`."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    B, _, L, E = q.shape
    S = k.shape[2]
    bias = np.zeros((B, 1, L, S))
    if mask is not None:
        m = np.where(mask, 0.0, -np.inf) if mask.dtype == np.bool_ else mask.astype(np.float64)
        m = np.concatenate([m, np.full(m.shape[:-1] + (S - m.shape[-1],), -np.inf)], -1)
        bias = bias + m
    offset = (nonpad - L).reshape(-1, 1, 1, 1) if nonpad is not None else np.zeros((1, 1, 1, 1))
    i = np.arange(L).reshape(1, 1, -1, 1) + offset
    j = np.arange(S).reshape(1, 1, 1, -1)
    keep = np.ones((B, 1, L, S), bool)
    if causal:
        keep &= j <= i
    if left >= 0:
        keep &= i - j <= left
    if right >= 0:
        keep &= j - i <= right
    if nonpad is not None:
        keep &= j < nonpad.reshape(-1, 1, 1, 1)
    bias = np.where(keep, bias, -np.inf)
    qk = q @ np.swapaxes(k, -1, -2) / np.sqrt(E)
    if softcap:
        qk = softcap * np.tanh(qk / softcap)
    with_bias = qk + bias
    hidden = np.isneginf(bias.max(-1, keepdims=True))
    e = np.exp(with_bias - np.where(hidden, 0, with_bias.max(-1, keepdims=True)))
    p = np.where(hidden, 0.0, e / np.where(hidden, 1, e.sum(-1, keepdims=True)))
    out = {0: qk, 1: qk, 2: with_bias, 3: p}.get(mode)
    return p @ v, out


@pytest.mark.parametrize("lq,lk", [(3, 6), (6, 4)])
def test_attention_causal_is_aligned_at_the_top_left(rng, lq, lk):
    # without past keys, query i sees keys 0..i whatever L and S (ONNX Runtime differs here)
    q, k, v = randn(rng, 2, 3, lq, 8), randn(rng, 2, 3, lk, 8), randn(rng, 2, 3, lk, 8)
    got = run_kiln(helper.make_node("Attention", ["q", "k", "v"], [], is_causal=1),
                   {"q": q, "k": k, "v": v}, 1, 23)[0]
    np.testing.assert_allclose(got, attention_reference(q, k, v, causal=True)[0], rtol=1e-4,
                               atol=1e-5)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_attention_softcap_and_qk_matmul_output(rng, mode):
    q, k, v = randn(rng, 2, 2, 5, 8) * 3, randn(rng, 2, 2, 7, 8) * 3, randn(rng, 2, 2, 7, 8)
    mask = rng.random((5, 7)) > 0.3
    mask[1] = False  # a row that sees no key: zeros
    node = helper.make_node("Attention", ["q", "k", "v", "m"], [], softcap=2.5,
                            qk_matmul_output_mode=mode)
    feeds = {"q": q, "k": k, "v": v, "m": mask}
    y, _, _, qk = run_kiln(node, feeds, 4, 24)
    want_y, want_qk = attention_reference(q, k, v, mask[None, None], softcap=2.5, mode=mode)
    np.testing.assert_allclose(y, want_y, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(qk, want_qk, rtol=1e-4, atol=1e-5)
    assert not np.isnan(y).any() and (y[:, :, 1] == 0).all()


def test_attention_nonpad_kv_seqlen_and_windows(rng):
    # a static cache of 9 columns, each batch row valid up to its own length, queries at its end
    q, k, v = randn(rng, 3, 2, 2, 8), randn(rng, 3, 2, 9, 8), randn(rng, 3, 2, 9, 8)
    nonpad = np.array([9, 5, 2], np.int64)
    feeds = {"q": q, "k": k, "v": v, "n": nonpad}
    node = helper.make_node("Attention", ["q", "k", "v", "", "", "", "n"], [], is_causal=1)
    np.testing.assert_allclose(run_kiln(node, feeds, 1, 24)[0],
                               attention_reference(q, k, v, nonpad=nonpad, causal=True)[0],
                               rtol=1e-4, atol=1e-5)
    node = helper.make_node("Attention", ["q", "k", "v", "", "", "", "n"], [], is_causal=1,
                            left_window_size=2, right_window_size=0)
    np.testing.assert_allclose(run_kiln(node, feeds, 1, 25)[0],
                               attention_reference(q, k, v, nonpad=nonpad, causal=True, left=2,
                                                   right=0)[0], rtol=1e-4, atol=1e-5)


def test_attention_mask_of_fewer_keys(rng):
    q, k, v = randn(rng, 1, 2, 4, 8), randn(rng, 1, 2, 6, 8), randn(rng, 1, 2, 6, 8)
    m = randn(rng, 4, 4)  # the last two keys hidden
    got = run_kiln(helper.make_node("Attention", ["q", "k", "v", "m"], []),
                   {"q": q, "k": k, "v": v, "m": m}, 1, 23)[0]
    np.testing.assert_allclose(got, attention_reference(q, k, v, m[None, None])[0], rtol=1e-4,
                               atol=1e-5)


def test_what_is_not_mapped_fails_naming_it(rng):
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], softmax_precision=TensorProto.INT8)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT,
                                                                      [1, 2, 3, 4])
                                        for n in "qkv"],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)])
    with pytest.raises(kiln.UnsupportedError, match="softmax_precision"):
        kiln.onnx.load_bytes(model.SerializeToString())
    # an op of a newer opset that kiln does not map is refused, named
    node = helper.make_node("ImageDecoder", ["x"], ["y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8,
                                                                      [64])],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 22)])
    with pytest.raises(kiln.UnsupportedError, match="ImageDecoder"):
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


@pytest.mark.parametrize("n,length", [(6, None), (6, 11), (5, 8), (9, 16)])
def test_dft_inverse_of_a_onesided_spectrum_is_numpys_irfft(rng, n, length):
    # DFT with inverse=1 and onesided=1 (opset 20): n bins of a real signal's spectrum -> the
    # signal, of dft_length points (2 (n - 1) by default), against numpy
    x = randn(rng, 2, n, 3, 2)
    ins = ["x", "len" if length else "", "axis"]
    feeds = {"x": x, "axis": np.array(1, np.int64)}
    if length:
        feeds["len"] = np.array(length, np.int64)
    node = helper.make_node("DFT", ins, [], onesided=1, inverse=1)
    vi = [helper.make_tensor_value_info(k, TYPES[v.dtype.type], v.shape) for k, v in feeds.items()]
    node.output[:] = ["y"]
    model = helper.make_model(
        helper.make_graph([node], "g", vi, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                          None)]),
        opset_imports=[helper.make_opsetid("", 20)])
    frozen = {k: v for k, v in feeds.items() if k != "x"}
    exe = kiln.onnx.load_bytes(model.SerializeToString(), input_values=frozen).compile(device="cpu")
    got = exe.run({"x": x})[0].numpy()
    spectrum = x[..., 0].astype(np.float64) + 1j * x[..., 1]
    want = np.fft.irfft(spectrum, n=length, axis=1)[..., None]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def col2im_reference(x, image, block, dil, pads, stride):
    """numpy: the L blocks of x (N, C·kh·kw, L) summed into a padded (N, C, H, W) image, cropped."""
    n, ck, _ = x.shape
    k = int(np.prod(block))
    grid = [(image[d] + pads[d] + pads[d + 2] - dil[d] * (block[d] - 1) - 1) // stride[d] + 1
            for d in range(2)]
    out = np.zeros((n, ck // k, image[0] + pads[0] + pads[2], image[1] + pads[1] + pads[3]))
    for ch in range(ck // k):
        for i in range(block[0]):
            for j in range(block[1]):
                for bh in range(grid[0]):
                    for bw in range(grid[1]):
                        out[:, ch, bh * stride[0] + i * dil[0], bw * stride[1] + j * dil[1]] += \
                            x[:, ch * k + i * block[1] + j, bh * grid[1] + bw]
    return out[:, :, pads[0]:pads[0] + image[0], pads[1]:pads[1] + image[1]]


@pytest.mark.parametrize("image,block,dil,pads,stride", [
    ([5, 5], [2, 2], [1, 1], [0, 0, 0, 0], [1, 1]),
    ([7, 6], [3, 2], [2, 1], [1, 0, 2, 1], [2, 1]),
    ([8, 9], [2, 3], [1, 2], [1, 1, 1, 1], [3, 2]),
])
def test_col2im_against_numpy(rng, image, block, dil, pads, stride):
    grid = [(image[d] + pads[d] + pads[d + 2] - dil[d] * (block[d] - 1) - 1) // stride[d] + 1
            for d in range(2)]
    x = randn(rng, 2, 3 * block[0] * block[1], grid[0] * grid[1])
    node = helper.make_node("Col2Im", ["x", "image", "block"], ["y"], dilations=dil, pads=pads,
                            strides=stride)
    inits = [helper.make_tensor("image", TensorProto.INT64, [2], image),
             helper.make_tensor("block", TensorProto.INT64, [2], block)]
    model = helper.make_model(
        helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                      x.shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          initializer=inits),
        opset_imports=[helper.make_opsetid("", 18)])
    got = kiln.onnx.load_bytes(model.SerializeToString()).compile(device="cpu").run({"x": x})[0]
    np.testing.assert_allclose(got.numpy(), col2im_reference(x, image, block, dil, pads, stride),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axis,exclusive,reverse", [(1, 0, 0), (0, 1, 0), (2, 0, 1), (-1, 1, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_cumprod_against_numpy(rng, axis, exclusive, reverse, dtype):
    x = (rng.uniform(0.5, 1.5, (3, 7, 5)) if dtype == np.float32
         else rng.integers(-3, 4, (3, 7, 5))).astype(dtype)
    node = helper.make_node("CumProd", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    model = helper.make_model(
        helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TYPES[dtype], x.shape)],
                          [helper.make_tensor_value_info("y", TYPES[dtype], None)],
                          initializer=[helper.make_tensor("axis", TensorProto.INT64, [], [axis])]),
        opset_imports=[helper.make_opsetid("", 26)])
    got = kiln.onnx.load_bytes(model.SerializeToString()).compile(device="cpu").run({"x": x})[0]
    v = np.flip(x, axis) if reverse else x
    want = np.cumprod(v.astype(np.float64), axis=axis)
    if exclusive:
        want = np.concatenate([np.ones_like(np.take(want, [0], axis=axis)),
                               np.delete(want, -1, axis=axis)], axis=axis)
    if reverse:
        want = np.flip(want, axis)
    np.testing.assert_allclose(got.numpy().astype(np.float64), want, rtol=1e-5)


def causal_conv_reference(x, w, b, past, activation):
    """CausalConvWithState's definition in numpy (float64): the causal depthwise conv1d over the
    past state and the input, SiLU where asked, the last k - 1 positions as the new state."""
    batch, c, length = x.shape
    k = w.shape[2]
    pad = past if past is not None else np.zeros((batch, c, k - 1))
    padded = np.concatenate([pad, x], axis=2).astype(np.float64)
    y = np.zeros((batch, c, length))
    for t in range(length):
        y[:, :, t] = (padded[:, :, t:t + k] * w[:, 0, :].astype(np.float64)).sum(-1)
    if b is not None:
        y += b[None, :, None]
    if activation in ("silu", "swish"):
        y = y / (1 + np.exp(-y))
    return y, padded[:, :, padded.shape[2] - (k - 1):]


@pytest.mark.parametrize("k, activation, bias, past", [
    (4, "none", False, False), (4, "silu", True, True), (3, "swish", False, True),
    (1, "silu", True, False)])
def test_causal_conv_with_state_against_numpy(rng, k, activation, bias, past):
    """CausalConvWithState (opset 27) with a symbolic batch and length, at two shapes, against its
    definition in numpy (ONNX Runtime 1.32 has no kernel for it): output and present_state."""
    c = 6
    names = ["x", "w", "b" if bias else "", "p" if past else ""]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", c, "L"]),
           helper.make_tensor_value_info("w", TensorProto.FLOAT, [c, 1, k])]
    if bias:
        ins.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, [c]))
    if past:
        ins.append(helper.make_tensor_value_info("p", TensorProto.FLOAT, ["B", c, k - 1]))
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "state")]
    node = helper.make_node("CausalConvWithState", names, ["y", "state"], activation=activation)
    model = helper.make_model(helper.make_graph([node], "g", ins, outs),
                              opset_imports=[helper.make_opsetid("", 27)])
    model.ir_version = 10
    exe = kiln.onnx.load_bytes(model.SerializeToString()).compile(device="cpu")
    for batch, length in ((2, 9), (3, 2)):
        feeds = {"x": randn(rng, batch, c, length), "w": randn(rng, c, 1, k)}
        if bias:
            feeds["b"] = randn(rng, c)
        if past:
            feeds["p"] = randn(rng, batch, c, k - 1)
        want = causal_conv_reference(feeds["x"], feeds["w"], feeds.get("b"), feeds.get("p"),
                                     activation)
        got = exe.run(feeds)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-5)


def linear_attention_reference(q, k, v, past, decay, beta, hq, hkv, rule, scale):
    """LinearAttention's definition token by token in float64 (state (B, H_kv, d_k, d_v))."""
    b, t, _ = q.shape
    dk, dv, g = q.shape[2] // hq, v.shape[2] // hkv, hq // hkv
    q4 = q.reshape(b, t, hq, dk).astype(np.float64)
    k4 = k.reshape(b, t, hkv, dk).astype(np.float64)
    v4 = v.reshape(b, t, hkv, dv).astype(np.float64)
    s = past.astype(np.float64) if past is not None else np.zeros((b, hkv, dk, dv))
    out = np.zeros((b, t, hq, dv))
    for i in range(t):
        if rule in ("gated", "gated_delta"):
            d = decay[:, i].reshape(b, hkv, -1).astype(np.float64)
            s = s * np.exp(d)[..., None]
        vt = v4[:, i]
        if rule in ("delta", "gated_delta"):
            bt = beta[:, i].reshape(b, -1, 1).astype(np.float64)
            vt = bt * (vt - np.einsum("bhdm,bhd->bhm", s, k4[:, i]))
        s = s + k4[:, i][..., :, None] * vt[..., None, :]
        out[:, i] = scale * np.einsum("bhd,bhdm->bhm", q4[:, i], np.repeat(s, g, axis=1))
    return out.reshape(b, t, hq * dv), s


@pytest.mark.parametrize("rule, hq, hkv, decay_per_head, past", [
    ("linear", 4, 4, False, False), ("gated", 4, 2, True, True), ("delta", 2, 2, False, True),
    ("gated_delta", 6, 2, False, False), ("gated_delta", 4, 1, True, True)])
def test_linear_attention_against_numpy(rng, rule, hq, hkv, decay_per_head, past):
    """LinearAttention (opset 27) with a symbolic batch, at two batch sizes, against its
    definition in float64 (ONNX Runtime 1.32 has no kernel for it): output and present_state."""
    t, dk, dv = 5, 4, 3
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    f = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info("q", f, ["B", t, hq * dk]),
           helper.make_tensor_value_info("k", f, ["B", t, hkv * dk]),
           helper.make_tensor_value_info("v", f, ["B", t, hkv * dv])]
    names = ["q", "k", "v", "p" if past else "", "g" if gating else "", "beta" if delta else ""]
    if past:
        ins.append(helper.make_tensor_value_info("p", f, ["B", hkv, dk, dv]))
    if gating:
        ins.append(helper.make_tensor_value_info("g", f, ["B", t, hkv if decay_per_head else hkv * dk]))
    if delta:
        ins.append(helper.make_tensor_value_info("beta", f, ["B", t, hkv]))
    while names and not names[-1]:
        names.pop()
    node = helper.make_node("LinearAttention", names, ["y", "state"], q_num_heads=hq,
                            kv_num_heads=hkv, update_rule=rule)
    outs = [helper.make_tensor_value_info(n, f, None) for n in ("y", "state")]
    model = helper.make_model(helper.make_graph([node], "g", ins, outs),
                              opset_imports=[helper.make_opsetid("", 27)])
    model.ir_version = 10
    exe = kiln.onnx.load_bytes(model.SerializeToString()).compile(device="cpu")
    for batch in (2, 3):
        feeds = {"q": randn(rng, batch, t, hq * dk), "k": randn(rng, batch, t, hkv * dk) * 0.5,
                 "v": randn(rng, batch, t, hkv * dv)}
        if past:
            feeds["p"] = randn(rng, batch, hkv, dk, dv)
        if gating:
            feeds["g"] = -np.abs(randn(rng, batch, t, hkv if decay_per_head else hkv * dk))
        if delta:
            feeds["beta"] = rng.uniform(0, 1, (batch, t, hkv)).astype(np.float32)
        want = linear_attention_reference(feeds["q"], feeds["k"], feeds["v"], feeds.get("p"),
                                          feeds.get("g"), feeds.get("beta"), hq, hkv, rule,
                                          1 / np.sqrt(dk))
        got = exe.run(feeds)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            np.testing.assert_allclose(g.numpy(), w, rtol=1e-4, atol=1e-4)


def test_linear_attention_of_a_run_time_length_is_refused_by_name():
    f = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info(n, f, ["B", "T", 8]) for n in ("q", "k", "v")]
    node = helper.make_node("LinearAttention", ["q", "k", "v"], ["y"], q_num_heads=2,
                            kv_num_heads=2, update_rule="linear")
    model = helper.make_model(helper.make_graph(
        [node], "g", ins, [helper.make_tensor_value_info("y", f, None)]),
        opset_imports=[helper.make_opsetid("", 27)])
    model.ir_version = 10
    with pytest.raises(kiln.Error) as e:
        kiln.onnx.load_bytes(model.SerializeToString()).compile(device="cpu")
    assert "LinearAttention" in str(e.value) and "sequence length" in str(e.value)
