"""ONNX ops that kiln writes out with several of its ops, FlexAttention (ai.onnx.preview 1),
TfIdfVectorizer (opset 9), Det (opset 11), DeformConv (opset 19) and RoiAlign (opsets 10 and 16),
imported by kiln and run on fresh random data beside independent references, on the CPU and on
CUDA: RoiAlign against ONNX's reference evaluator and ONNX Runtime (both modes, both coordinate
transformations and opset 10's, fixed and adaptive sampling, rois past the image, an empty roi);
DeformConv against a float64 numpy computation of its definition (multilinear samples with zeros
outside, 1-D and 2-D, groups, offset groups, strides, dilations, pads, masks, bias) and ONNX's
reference evaluator; Det against numpy's float64 determinant (singular matrices, zero pivots,
batches, half precision); FlexAttention against a float64 numpy computation of the operator's
definition (with score_mod and prob_mod subgraphs, grouped heads, half precision) and ONNX's
reference evaluator; TfIdfVectorizer against ONNX Runtime in its three modes (and ONNX's reference
evaluator in TF mode, as it indexes the weights by output coordinate where the operator's
definition and ONNX Runtime take them per pool n-gram), with skips, several n-gram lengths, 1-D
and 2-D int32/int64 inputs."""
import numpy as np
import pytest

import kiln
from conftest import cuda_available

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not cuda_available(), reason="no CUDA device"))]
TYPES = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16,
         np.float64: TensorProto.DOUBLE, np.int32: TensorProto.INT32, np.int64: TensorProto.INT64}


def model_of(node, feeds, out_type, opsets):
    ins = [helper.make_tensor_value_info(k, TYPES[v.dtype.type], v.shape) for k, v in feeds.items()]
    out = helper.make_tensor_value_info("y", out_type, None)
    node.output[:] = ["y"]
    model = helper.make_model(helper.make_graph([node], "g", ins, [out]),
                              opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    model.ir_version = 10
    return model


def run_kiln(model, feeds, device):
    exe = kiln.onnx.load_bytes(model.SerializeToString()).compile(device=device)
    (got,) = exe.run(feeds)
    return got.numpy()


# FlexAttention ------------------------------------------------------------------------------

def mod_graph(name, body):
    """A one-input, one-output modifier subgraph (B, H, L, S) float -> same."""
    x = helper.make_tensor_value_info("s", TensorProto.FLOAT, None)
    y = helper.make_tensor_value_info("t", TensorProto.FLOAT, None)
    return helper.make_graph(body, name, [x], [y])


def soft_cap_graph(cap):
    c = helper.make_tensor("cap", TensorProto.FLOAT, [], [cap])
    return mod_graph("score_mod", [
        helper.make_node("Constant", [], ["c"], value=c),
        helper.make_node("Div", ["s", "c"], ["d"]),
        helper.make_node("Tanh", ["d"], ["h"]),
        helper.make_node("Mul", ["h", "c"], ["t"])])


def square_graph():
    return mod_graph("prob_mod", [helper.make_node("Mul", ["s", "s"], ["t"])])


def flex_reference(q, k, v, scale, cap, square):
    """The operator's definition in float64: scores = scale q kᵀ (key heads shared by Hq / Hkv
    query heads), cap·tanh(scores / cap), softmax over keys, squared probabilities, p v."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = scale * q @ np.swapaxes(k, -1, -2)
    if cap:
        s = cap * np.tanh(s / cap)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    if square:
        p = p * p
    return p @ v


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2)])
@pytest.mark.parametrize("mods", ["none", "score", "both"])
def test_flex_attention(rng, device, dtype, heads, mods):
    hq, hkv = heads
    feeds = {"q": rng.standard_normal((2, hq, 5, 8)).astype(dtype),
             "k": rng.standard_normal((2, hkv, 7, 8)).astype(dtype),
             "v": rng.standard_normal((2, hkv, 7, 6)).astype(dtype)}
    attrs = {}
    cap = 2.5 if mods != "none" else 0
    if mods != "none":
        attrs["score_mod"] = soft_cap_graph(cap)
    if mods == "both":
        attrs["prob_mod"] = square_graph()
    scale = 0.3 if dtype != np.float16 else None
    if scale is not None:
        attrs["scale"] = scale
    if dtype == np.float64 and mods != "none":  # modifiers of f64 scores are f64 graphs
        pytest.skip("the modifier graphs here are float32")
    node = helper.make_node("FlexAttention", ["q", "k", "v"], ["y"], domain="ai.onnx.preview",
                            **attrs)
    model = model_of(node, feeds, TYPES[dtype], [("", 23), ("ai.onnx.preview", 1)])
    got = run_kiln(model, feeds, device).astype(np.float64)
    want = flex_reference(feeds["q"], feeds["k"], feeds["v"], scale or 8 ** -0.5, cap,
                          mods == "both")
    tol = 2e-3 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    ref = ReferenceEvaluator(model).run(None, feeds)[0].astype(np.float64)
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)


def test_flex_attention_errors():
    feeds = {"q": np.zeros((1, 3, 2, 4), np.float32), "k": np.zeros((1, 2, 2, 4), np.float32),
             "v": np.zeros((1, 2, 2, 4), np.float32)}
    node = helper.make_node("FlexAttention", ["q", "k", "v"], ["y"], domain="ai.onnx.preview")
    model = model_of(node, feeds, TensorProto.FLOAT, [("", 23), ("ai.onnx.preview", 1)])
    with pytest.raises(kiln.Error, match="3 query heads are not a multiple of 2 key heads"):
        kiln.onnx.load_bytes(model.SerializeToString())
    feeds["k"] = feeds["v"] = np.zeros((1, 3, 2, 4), np.float32)
    two_out = helper.make_graph([helper.make_node("Identity", ["s"], ["t"]),
                                 helper.make_node("Identity", ["s"], ["u"])], "m",
                                [helper.make_tensor_value_info("s", TensorProto.FLOAT, None)],
                                [helper.make_tensor_value_info("t", TensorProto.FLOAT, None),
                                 helper.make_tensor_value_info("u", TensorProto.FLOAT, None)])
    node = helper.make_node("FlexAttention", ["q", "k", "v"], ["y"], domain="ai.onnx.preview",
                            score_mod=two_out)
    model = model_of(node, feeds, TensorProto.FLOAT, [("", 23), ("ai.onnx.preview", 1)])
    with pytest.raises(kiln.Error, match="score_mod has 1 inputs and 2 outputs"):
        kiln.onnx.load_bytes(model.SerializeToString())


# TfIdfVectorizer ------------------------------------------------------------------------------

def random_pool(rng, vocab, lengths, per_length, shared):
    """A pool of distinct n-grams of each length (ngram_counts: each length's first index), and
    output coordinates, two of which coincide where `shared`."""
    pool, starts, total = [], [], 0
    for n in range(1, max(lengths) + 1):
        starts.append(len(pool))
        if n not in lengths:
            continue
        grams = {tuple(int(t) for t in rng.integers(0, vocab, n))
                 for _ in range(per_length * 4)}
        for g in sorted(grams, key=lambda _: rng.random())[:per_length]:
            pool += g
            total += 1
    coords = rng.permutation(total + 2)[:total]
    if shared:
        coords[-1] = coords[0]  # two n-grams counted at one coordinate
    return pool, starts, [int(c) for c in coords]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize("lengths, skips", [((1,), 0), ((2,), 3), ((1, 2, 3), 2), ((2, 3), 0)])
@pytest.mark.parametrize("shape, dtype", [((3, 17), np.int64), ((23,), np.int32)])
def test_tfidf_vectorizer(rng, device, mode, lengths, skips, shape, dtype):
    vocab = 5  # few tokens, so that n-grams occur
    # (ONNX Runtime keeps one of the n-grams that share a coordinate in IDF mode; kiln adds them)
    pool, starts, coords = random_pool(rng, vocab, set(lengths), 6, shared=mode != "IDF")
    attrs = dict(mode=mode, min_gram_length=min(lengths), max_gram_length=max(lengths),
                 max_skip_count=skips, ngram_counts=starts, ngram_indexes=coords,
                 pool_int64s=[int(p) for p in pool])
    if mode != "TF":
        attrs["weights"] = list(rng.uniform(0.5, 2.0, len(coords)).astype(float))
    feeds = {"x": rng.integers(0, vocab, shape).astype(dtype)}
    model = model_of(helper.make_node("TfIdfVectorizer", ["x"], ["y"], **attrs), feeds,
                     TensorProto.FLOAT, [("", 9)])
    got = run_kiln(model, feeds, device)
    if mode == "TF":
        want = ReferenceEvaluator(model).run(None, feeds)[0]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


def test_tfidf_vectorizer_errors():
    feeds = {"x": np.zeros((2, 3), np.int64)}
    node = helper.make_node("TfIdfVectorizer", ["x"], ["y"], mode="BM25", min_gram_length=1,
                            max_gram_length=1, max_skip_count=0, ngram_counts=[0],
                            ngram_indexes=[0], pool_int64s=[1])
    with pytest.raises(kiln.Error, match="mode 'BM25'"):
        kiln.onnx.load_bytes(model_of(node, feeds, TensorProto.FLOAT, [("", 9)])
                             .SerializeToString())
    node = helper.make_node("TfIdfVectorizer", ["x"], ["y"], mode="TF", min_gram_length=1,
                            max_gram_length=1, max_skip_count=0, ngram_counts=[0],
                            ngram_indexes=[0], pool_strings=["a"])
    with pytest.raises(kiln.Error, match="pool_strings"):
        kiln.onnx.load_bytes(model_of(node, feeds, TensorProto.FLOAT, [("", 9)])
                             .SerializeToString())
    node = helper.make_node("TfIdfVectorizer", ["x"], ["y"], mode="TF", min_gram_length=2,
                            max_gram_length=2, max_skip_count=0, ngram_counts=[0, 0],
                            ngram_indexes=[0, 1], pool_int64s=[1, 2, 1, 2])
    with pytest.raises(kiln.Error, match=r"the pool holds the 2-gram \[1, 2\] twice"):
        kiln.onnx.load_bytes(model_of(node, feeds, TensorProto.FLOAT, [("", 9)])
                             .SerializeToString())


# Det ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("shape", [(1, 1), (2, 2), (3, 3), (2, 5, 5), (2, 3, 8, 8), (0, 4, 4),
                                   (0, 0)])
def test_det(rng, device, dtype, shape):
    x = rng.standard_normal(shape)
    if x.ndim == 3 and shape[0] > 0:
        x[0, :, 2] = 2 * x[0, :, 1]  # singular
        x[1, 0, 0] = 0  # a zero where elimination without pivoting would divide
    if dtype == np.float16:
        x = np.round(x * 4) / 4  # values f16 holds exactly
    x = x.astype(dtype)
    feeds = {"x": x}
    model = model_of(helper.make_node("Det", ["x"], ["y"]), feeds, TYPES[dtype], [("", 11)])
    got = run_kiln(model, feeds, device).astype(np.float64)
    want = np.linalg.det(x.astype(np.float64))
    assert got.shape == want.shape
    n = shape[-1]
    # the elimination's rounding: a few ulps of the type per step, relative to the products of
    # the rows' norms (Hadamard's bound on |det|)
    eps = {np.float32: 1e-6, np.float64: 1e-15, np.float16: 1e-6}[dtype]  # f16 runs in f32
    bound = np.prod(np.linalg.norm(x.astype(np.float64), axis=-1), axis=-1) if n else 1
    # (and an f16 result's own rounding: half a unit in its last place, 2^-11 of it)
    rounding = np.abs(want) * 2.0**-10 if dtype == np.float16 else 0
    np.testing.assert_array_less(np.abs(got - want), 8 * n * eps * bound + rounding + 1e-300)


def test_det_errors():
    feeds = {"x": np.zeros((2, 3), np.float32)}
    model = model_of(helper.make_node("Det", ["x"], ["y"]), feeds, TensorProto.FLOAT, [("", 11)])
    with pytest.raises(kiln.Error, match="is not square"):
        kiln.onnx.load_bytes(model.SerializeToString())


# DeformConv -----------------------------------------------------------------------------------

def sample(img, p):
    """img (I...) at the real position p, multilinear over the 2^s surrounding points, each
    outside the image counted as 0."""
    lo = np.floor(p).astype(np.int64)
    total = 0.0
    for corner in np.ndindex(*([2] * len(p))):
        at = lo + np.array(corner)
        weight = np.prod([1 - abs(p[d] - at[d]) for d in range(len(p))])
        if all(0 <= at[d] < img.shape[d] for d in range(len(p))):
            total += weight * img[tuple(at)]
    return total


def deform_conv_reference(x, w, offset, b, mask, group, og, strides, dil, pads):
    x, w, offset = (a.astype(np.float64) for a in (x, w, offset))
    n, C = x.shape[:2]
    O, cg = w.shape[:2]
    K, out = w.shape[2:], offset.shape[2:]
    s, taps = len(K), int(np.prod(K))
    off = offset.reshape(n, og, taps, s, *out)
    m = np.ones((n, og, taps, *out)) if mask is None else mask.reshape(n, og, taps, *out)
    y = np.zeros((n, O, *out))
    for bi in range(n):
        for o in range(O):
            g = o // (O // group)
            for ci in range(cg):
                c = g * cg + ci
                go = c // (C // og)
                for t, k in enumerate(np.ndindex(*K)):
                    for q in np.ndindex(*out):
                        p = np.array([-pads[d] + strides[d] * q[d] + dil[d] * k[d] +
                                      off[(bi, go, t, d) + q] for d in range(s)])
                        y[(bi, o) + q] += w[(o, ci) + k] * m[(bi, go, t) + q] * sample(x[bi, c], p)
    if b is not None:
        y += b.reshape((1, -1) + (1,) * s)
    return y


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [
    dict(x=(2, 4, 6, 5), k=(3, 3), group=1, og=1, strides=(1, 1), dil=(1, 1), pads=(1, 1, 1, 1),
         mask=True, bias=True),
    dict(x=(1, 4, 7, 6), k=(2, 3), group=2, og=2, strides=(2, 1), dil=(1, 2), pads=(0, 1, 1, 0),
         mask=False, bias=False),
    dict(x=(2, 6, 5, 5), k=(1, 2), group=1, og=3, strides=(1, 2), dil=(2, 1), pads=(0, 0, 0, 0),
         mask=True, bias=False),
    dict(x=(2, 2, 9), k=(3,), group=2, og=1, strides=(2,), dil=(1,), pads=(1, 2), mask=True,
         bias=True),
])
def test_deform_conv(rng, device, case):
    x = rng.standard_normal(case["x"]).astype(np.float32)
    C, size = case["x"][1], case["x"][2:]
    K, s = case["k"], len(case["k"])
    outs = 2 * case["group"]
    w = rng.standard_normal((outs, C // case["group"], *K)).astype(np.float32)
    out = [(size[d] + case["pads"][d] + case["pads"][d + s] - ((K[d] - 1) * case["dil"][d] + 1))
           // case["strides"][d] + 1 for d in range(s)]
    taps = int(np.prod(K))
    n = case["x"][0]
    # offsets up to 3 pixels: taps land between pixels and past the border
    feeds = {"x": x, "w": w,
             "offset": rng.uniform(-3, 3, (n, case["og"] * taps * s, *out)).astype(np.float32)}
    inputs = ["x", "w", "offset"]
    b = rng.standard_normal(outs).astype(np.float32) if case["bias"] else None
    mask = rng.uniform(0, 1, (n, case["og"] * taps, *out)).astype(np.float32) \
        if case["mask"] else None
    inputs += ["b" if b is not None else ""]
    if b is not None:
        feeds["b"] = b
    if mask is not None:
        inputs.append("mask")
        feeds["mask"] = mask
    while inputs[-1] == "":
        inputs.pop()
    node = helper.make_node("DeformConv", inputs, ["y"], group=case["group"],
                            offset_group=case["og"], strides=case["strides"],
                            dilations=case["dil"], pads=case["pads"], kernel_shape=K)
    model = model_of(node, feeds, TensorProto.FLOAT, [("", 19)])
    got = run_kiln(model, feeds, device).astype(np.float64)
    want = deform_conv_reference(x, w, feeds["offset"], b, mask, case["group"], case["og"],
                                 case["strides"], case["dil"], case["pads"])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    if s == 2:  # (ONNX's reference evaluator takes 2-D DeformConv only)
        ref = ReferenceEvaluator(model).run(None, feeds)[0].astype(np.float64)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_deform_conv_errors():
    feeds = {"x": np.zeros((1, 2, 5, 5), np.float32), "w": np.zeros((2, 2, 3, 3), np.float32),
             "offset": np.zeros((1, 18, 4, 4), np.float32)}
    node = helper.make_node("DeformConv", ["x", "w", "offset"], ["y"])
    with pytest.raises(kiln.Error, match="offset's spatial dim 0 is 4"):
        kiln.onnx.load_bytes(model_of(node, feeds, TensorProto.FLOAT, [("", 19)])
                             .SerializeToString())
    feeds["offset"] = np.zeros((1, 17, 3, 3), np.float32)
    with pytest.raises(kiln.Error, match="offset has 17 channels"):
        kiln.onnx.load_bytes(model_of(node, feeds, TensorProto.FLOAT, [("", 19)])
                             .SerializeToString())


# RoiAlign -------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("opset, transform", [(16, "half_pixel"), (16, "output_half_pixel"),
                                              (10, None)])
@pytest.mark.parametrize("ratio", [2, 0])
def test_roi_align(rng, device, mode, opset, transform, ratio):
    x = rng.standard_normal((2, 3, 9, 11)).astype(np.float32)
    n_rois = 6
    corner = rng.uniform(-3, 10, (n_rois, 2))
    size = rng.uniform(0.2, 9, (n_rois, 2))
    rois = np.concatenate([corner, corner + size], 1).astype(np.float32)
    rois[0] = [4, 4, 4, 4]  # an empty roi
    batch = rng.integers(0, 2, n_rois).astype(np.int64)
    attrs = dict(mode=mode, output_height=3, output_width=4, sampling_ratio=ratio,
                 spatial_scale=0.8)
    if transform:
        attrs["coordinate_transformation_mode"] = transform
    node = helper.make_node("RoiAlign", ["x", "rois", "b"], ["y"], **attrs)
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape),
           helper.make_tensor_value_info("b", TensorProto.INT64, batch.shape)]
    inits = []
    feeds = {"x": x, "b": batch}
    if ratio == 0:  # adaptive grids need the rois while importing: an initializer
        inits.append(onnx.numpy_helper.from_array(rois, "rois"))
    else:
        ins.append(helper.make_tensor_value_info("rois", TensorProto.FLOAT, rois.shape))
        feeds["rois"] = rois
    model = helper.make_model(
        helper.make_graph([node], "g", ins, [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)], initializer=inits),
        opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    got = run_kiln(model, feeds, device)
    assert got.shape == (n_rois, 3, 3, 4)
    if opset >= 16:  # (the reference evaluator takes opset 16's half_pixel default for opset 10)
        want = ReferenceEvaluator(model).run(None, feeds)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if mode == "avg" or opset < 16:
        ort = pytest.importorskip("onnxruntime")
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(got, sess.run(None, feeds)[0], rtol=1e-5, atol=1e-5)


def test_roi_align_adaptive_takes_the_rois_from_the_feeds(rng, tmp_path):
    """With sampling_ratio 0 and the rois a graph input, importing alone names them; a Session
    imports for each distinct rois value and matches the reference."""
    x = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
    b = np.zeros(2, np.int64)
    node = helper.make_node("RoiAlign", ["x", "rois", "b"], ["y"], sampling_ratio=0,
                            output_height=2, output_width=2)
    model = model_of(node, {"x": x, "rois": np.zeros((2, 4), np.float32), "b": b},
                     TensorProto.FLOAT, [("", 16)])
    with pytest.raises(kiln.Error, match="needs the rois while importing"):
        kiln.onnx.load_bytes(model.SerializeToString())
    path = str(tmp_path / "roi_align.onnx")
    onnx.save(model, path)
    s = kiln.onnx.Session(path, device="cpu")
    for rois in ([[0, 0, 5, 5], [1, 2, 3, 5.5]], [[0.5, 0, 2, 1], [0, 0, 6, 6]]):
        feeds = {"x": x, "rois": np.array(rois, np.float32), "b": b}
        (got,) = s.run(feeds)
        want = ReferenceEvaluator(model).run(None, feeds)[0]
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
