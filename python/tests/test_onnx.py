"""kiln.onnx: import a model built with onnx.helper and compare with onnxruntime."""
import numpy as np
import pytest

import kiln

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def make_model(rng, path):
    w = rng.standard_normal((4, 3)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["z"]),
             helper.make_node("Relu", ["z"], ["y"])]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="pytest")
    onnx.save(model, path)
    return w, b, model


def test_import_compile_and_run(rng, tmp_path):
    path = str(tmp_path / "tiny.onnx")
    w, b, model = make_model(rng, path)
    m = kiln.onnx.load(path, input_shapes={"x": [5, 4]})
    assert isinstance(m, kiln.onnx.Model)
    assert [i.name for i in m.inputs] == ["x"] and m.inputs[0].shape == [5, 4]
    assert m.inputs[0].dim_params == ["batch", ""] and "ValueInfo" in repr(m.inputs[0])
    assert m.outputs[0].name == "y" and m.outputs[0].dtype == kiln.f32
    assert m.opset == 17 and m.producer.startswith("pytest") and m.ir_version > 0
    assert m.parameter_count == 15 and m.parameter_bytes == 60 and m.fixed_inputs == []
    assert m.op_histogram == {"MatMul": 1, "Add": 1, "Relu": 1}
    x = rng.standard_normal((5, 4)).astype(np.float32)
    # float64 reference; f32 sums of four products: a few units in the last place of the terms
    want = np.maximum(x.astype(np.float64) @ w + b, 0)
    tol = dict(rtol=1e-5, atol=1e-6)
    exe = m.compile(device="cpu")
    np.testing.assert_allclose(exe.run({"x": x})[0].numpy(), want, **tol)
    # the same through the graph
    exe2 = m.graph.compile(m.output_tensors(), feed_shapes=m.feed_shapes(), device="cpu")
    np.testing.assert_allclose(exe2.run({m.inputs[0].tensor: x})[0].numpy(), want, **tol)
    # a dynamic batch fixed at compile time
    dyn = kiln.onnx.load_bytes(model.SerializeToString())
    assert dyn.inputs[0].shape == [-1, 4]
    e3 = dyn.compile(device="cpu", shapes={"x": [2, 4]})
    np.testing.assert_allclose(e3.run({"x": x[:2]})[0].numpy(), want[:2], **tol)
    try:
        import onnxruntime as ort

        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(exe.run({"x": x})[0].numpy(), sess.run(None, {"x": x})[0], rtol=1e-5)
    except ImportError:
        pass


def test_support_table_and_errors(tmp_path):
    ops = kiln.onnx.supported_ops()
    assert ("Relu", 14) in ops or any(o == "Relu" for o, _ in ops)
    assert kiln.onnx.is_supported("Conv", 17) and not kiln.onnx.is_supported("NoSuchOp", 17)
    node = helper.make_node("NoSuchOp", ["x"], ["y"])
    graph = helper.make_graph([node], "bad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(kiln.UnsupportedError, match="NoSuchOp"):
        kiln.onnx.load_bytes(model.SerializeToString())
    with pytest.raises(kiln.FormatError):
        kiln.onnx.load_bytes(b"not a model")
    with pytest.raises(kiln.IoError):
        kiln.onnx.load(str(tmp_path / "missing.onnx"), input_values={}, default_dim=-1, external_data_dir="")


def test_shape_arithmetic_stays_dynamic(rng, tmp_path):
    """Attention as exporters write it, with batch and sequence dynamic: Shape, Gather, Concat,
    Range, ConstantOfShape, Expand, a Slice and Reshapes fed by computed shapes. One executable
    runs every shape, against onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    f = np.float32
    tri = np.triu(np.full((16, 16), -1e4, f), 1)
    inits = {"table": rng.standard_normal((11, 8)).astype(f), "pos_table": rng.standard_normal((16, 8)).astype(f),
             "wq": rng.standard_normal((8, 8)).astype(f), "wk": rng.standard_normal((8, 8)).astype(f),
             "wv": rng.standard_normal((8, 8)).astype(f), "bias": rng.standard_normal((1, 1, 8)).astype(f),
             "tri": tri, "zero": np.array(0, np.int64), "one": np.array(1, np.int64),
             "i0": np.array([0], np.int64), "i1": np.array([1], np.int64), "heads": np.array([2, 4], np.int64),
             "zz": np.array([0, 0], np.int64), "axes01": np.array([0, 1], np.int64),
             "merge": np.array([0, 0, -1], np.int64), "half": np.array(0.5, f)}
    n = helper.make_node
    nodes = [n("Gather", ["table", "ids"], ["emb"]),
             n("Shape", ["emb"], ["shape"]),
             n("Gather", ["shape", "zero"], ["B"]), n("Gather", ["shape", "one"], ["S"]),
             n("Unsqueeze", ["B", "i0"], ["B1"]), n("Unsqueeze", ["S", "i0"], ["S1"]),
             n("Range", ["zero", "S", "one"], ["pos"]),
             n("Gather", ["pos_table", "pos"], ["pe"]),
             n("Add", ["emb", "pe"], ["h"]),
             n("Concat", ["B1", "S1", "heads"], ["split_shape"], axis=0)]
    for w in "qkv":
        nodes += [n("MatMul", ["h", "w" + w], [w]), n("Reshape", [w, "split_shape"], [w + "4"]),
                  n("Transpose", [w + "4"], [w + "h"], perm=[0, 2, 1, 3])]
    nodes += [n("Transpose", ["kh"], ["kt"], perm=[0, 1, 3, 2]),
              n("MatMul", ["qh", "kt"], ["s0"]), n("Mul", ["s0", "half"], ["s1"]),
              n("Concat", ["S1", "S1"], ["ss"], axis=0),
              n("Slice", ["tri", "zz", "ss", "axes01"], ["causal"]),
              n("ConstantOfShape", ["ss"], ["zeros"], value=numpy_helper.from_array(np.array([0.25], f))),
              n("Add", ["causal", "zeros"], ["mask"]),
              n("Add", ["s1", "mask"], ["s2"]), n("Softmax", ["s2"], ["p"], axis=-1),
              n("MatMul", ["p", "vh"], ["o4"]), n("Transpose", ["o4"], ["o"], perm=[0, 2, 1, 3]),
              n("Reshape", ["o", "merge"], ["o3"]),
              n("Shape", ["o3"], ["oshape"]), n("Expand", ["bias", "oshape"], ["bb"]),
              n("Add", ["o3", "bb"], ["y"])]
    graph = helper.make_graph(
        nodes, "attention", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = str(tmp_path / "attention.onnx")
    onnx.save(model, path)
    m = kiln.onnx.load(path)
    assert m.inputs[0].shape == [-1, -1] and m.fixed_inputs == []
    exe = m.compile(device="cpu")
    assert exe.is_dynamic
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for b, s in ((1, 5), (3, 9), (2, 16), (1, 5), (4, 1)):
        feeds = {"ids": rng.integers(0, 11, (b, s)).astype(np.int64)}
        got = exe.run(feeds)[0].numpy()
        assert got.shape == (b, s, 8)
        np.testing.assert_allclose(got, sess.run(None, feeds)[0], rtol=1e-4, atol=1e-4)
    assert exe.shape_cache()["misses"] == 4 and exe.shape_cache()["hits"] == 1


def dynamic_with_ort(ort, graph, path):
    """The opset-18 model of graph saved at path: kiln's executable (dynamic, nothing frozen at
    import) and an onnxruntime session of it."""
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    m = kiln.onnx.load(str(path))
    assert m.fixed_inputs == []
    exe = m.compile(device="cpu")
    assert exe.is_dynamic
    return exe, ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_tile_and_pad_take_computed_values(rng, tmp_path):
    """Tile and Pad whose repeats and pads are computed from a dynamic input's shape (a sequence
    padded to a multiple of 4, as windowed attention pads; rows repeated batch times; Pad with
    axes): one executable at several shapes, against onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    c = {"zero": np.array(0, np.int64), "one": np.array(1, np.int64), "four": np.array(4, np.int64),
         "i0": np.array([0], np.int64), "i1": np.array([1], np.int64), "two": np.array([2], np.int64),
         "axes1": np.array([1], np.int64), "fill": np.array(-2.5, np.float32)}
    n = helper.make_node
    nodes = [n("Shape", ["x"], ["shape"]),
             n("Gather", ["shape", "i0"], ["B1"]), n("Gather", ["shape", "one"], ["S"]),
             # (4 - S % 4) % 4 at the end of axis 1
             n("Mod", ["S", "four"], ["r"]), n("Sub", ["four", "r"], ["r2"]), n("Mod", ["r2", "four"], ["e"]),
             n("Unsqueeze", ["e", "i0"], ["e1"]),
             n("Concat", ["i0", "i0", "i0", "e1"], ["pads"], axis=0),
             n("Pad", ["x", "pads", "fill"], ["padded"]),
             n("Concat", ["two", "B1"], ["reps"], axis=0),
             n("Tile", ["x", "reps"], ["tiled"]),
             n("Concat", ["B1", "e1"], ["pads_axis1"], axis=0),
             n("Pad", ["x", "pads_axis1", "", "axes1"], ["edged"], mode="edge")]
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("padded", "tiled", "edged")]
    graph = helper.make_graph(
        nodes, "tile_pad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])], outs,
        [numpy_helper.from_array(v, k) for k, v in c.items()])
    exe, sess = dynamic_with_ort(ort, graph, tmp_path / "tile_pad.onnx")
    for b, s in ((1, 5), (3, 8), (2, 11)):
        feeds = {"x": rng.standard_normal((b, s)).astype(np.float32)}
        for got, want in zip(exe.run(feeds), sess.run(None, feeds)):
            np.testing.assert_array_equal(got.numpy(), want)


def test_topk_and_one_hot_sized_by_computed_values(rng, tmp_path):
    """TopK whose k and OneHot whose depth are computed from a dynamic input's shape (the top
    half of each row; one-hot rows as wide as the input, from negative indices too): one
    executable at several shapes, against onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    c = {"one": np.array(1, np.int64), "two": np.array(2, np.int64), "i0": np.array([0], np.int64),
         "vals": np.array([-1.0, 3.0], np.float32)}
    n = helper.make_node
    nodes = [n("Shape", ["x"], ["shape"]), n("Gather", ["shape", "one"], ["S"]),
             n("Div", ["S", "two"], ["half"]), n("Unsqueeze", ["half", "i0"], ["k"]),
             n("TopK", ["x", "k"], ["top", "where"], axis=1),
             n("OneHot", ["ids", "S", "vals"], ["hot"], axis=-1)]
    outs = [helper.make_tensor_value_info("top", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("where", TensorProto.INT64, None),
            helper.make_tensor_value_info("hot", TensorProto.FLOAT, None)]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"]),
           helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])]
    graph = helper.make_graph(nodes, "topk_one_hot", ins, outs,
                              [numpy_helper.from_array(v, k) for k, v in c.items()])
    exe, sess = dynamic_with_ort(ort, graph, tmp_path / "topk_one_hot.onnx")
    for b, s in ((1, 5), (3, 8), (2, 11)):
        # distinct values, so that the order of ties cannot differ
        x = rng.permutation(b * s).reshape(b, s).astype(np.float32)
        feeds = {"x": x, "ids": rng.integers(-s, s, 7)}
        got, want = exe.run(feeds), sess.run(None, feeds)
        assert got[0].shape == (b, s // 2) and got[2].shape == (7, s)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.numpy(), w)


def test_wrap_pad_and_partial_resize_over_dynamic_dims(rng, tmp_path):
    """Pad in wrap mode over dynamic dims (constant pads, and pads computed from the shape); Resize
    with sizes computed for some axes only, with scales, and tf_crop_and_resize with its region,
    all on a dynamic input: one executable at several shapes, against onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    c = {"pads": np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64), "i1": np.array([1], np.int64),
         "i2": np.array([2], np.int64), "i3": np.array([3], np.int64),
         "scales": np.array([1.0, 1.0, 1.5, 2.0], np.float32),
         "roi": np.array([0.1, 0.2, 0.9, 0.7], np.float32), "crop_sizes": np.array([4, 5], np.int64)}
    n = helper.make_node
    nodes = [n("Pad", ["x", "pads"], ["wrapped"], mode="wrap"),
             n("Shape", ["x"], ["shape"]),
             # pads of the last axis computed from its size: (W % 2 + 1) before, 1 after
             n("Gather", ["shape", "i3"], ["W"]), n("Mod", ["W", "i2"], ["r"]), n("Add", ["r", "i1"], ["b"]),
             n("Concat", ["b", "i1"], ["pads3"], axis=0),
             n("Pad", ["x", "pads3", "", "i3"], ["wrapped3"], mode="wrap"),
             # sizes of axes 3 and 2 (in that order): twice the width, one more than the height
             n("Gather", ["shape", "i2"], ["H"]), n("Mul", ["W", "i2"], ["W2"]), n("Add", ["H", "i1"], ["H1"]),
             n("Concat", ["W2", "H1"], ["sizes32"], axis=0),
             n("Resize", ["x", "", "", "sizes32"], ["part"], axes=[3, 2], mode="linear"),
             n("Resize", ["x", "", "scales"], ["scaled"], mode="cubic"),
             n("Resize", ["x", "roi", "", "crop_sizes"], ["crop"], axes=[2, 3], mode="linear",
               coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=-1.0)]
    names = ("wrapped", "wrapped3", "part", "scaled", "crop")
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in names]
    graph = helper.make_graph(
        nodes, "wrap_resize",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "c", "h", "w"])], outs,
        [numpy_helper.from_array(v, k) for k, v in c.items()])
    exe, sess = dynamic_with_ort(ort, graph, tmp_path / "wrap_resize.onnx")
    for shape in ((1, 2, 3, 4), (2, 1, 5, 3), (1, 3, 2, 7)):
        feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
        for name, g, want in zip(names, exe.run(feeds), sess.run(None, feeds)):
            assert g.numpy().shape == want.shape, name
            np.testing.assert_allclose(g.numpy(), want, rtol=1e-5, atol=1e-5, err_msg=name)


def test_same_padding_over_dynamic_spatial_dims(rng, tmp_path):
    """Conv with auto_pad SAME_UPPER / SAME_LOWER and stride 2 over dynamic height and width: the
    pads depend on each size and are resolved per shape; against onnxruntime at several shapes."""
    ort = pytest.importorskip("onnxruntime")
    w = (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["up"], auto_pad="SAME_UPPER", strides=[2, 2]),
             helper.make_node("Conv", ["x", "w"], ["low"], auto_pad="SAME_LOWER", strides=[2, 3])]
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("up", "low")]
    graph = helper.make_graph(
        nodes, "same", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", "w"])],
        outs, [numpy_helper.from_array(w, "w")])
    path = str(tmp_path / "same.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    exe = kiln.onnx.load(path).compile(device="cpu")
    assert exe.is_dynamic
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for shape in ((1, 3, 9, 8), (2, 3, 6, 11), (1, 3, 2, 1)):
        x = rng.standard_normal(shape).astype(np.float32)
        for g, want in zip(exe.run({"x": x}), sess.run(None, {"x": x})):
            assert g.numpy().shape == want.shape
            np.testing.assert_allclose(g.numpy(), want, rtol=1e-5, atol=1e-5)
    assert exe.shape_cache()["symbolic"]


def test_dim_params_stay_dynamic(rng, tmp_path):
    """A model with dim_params imports with them dynamic and named: one executable runs every
    batch and image size, against onnxruntime; inputs sharing a dim_param must agree."""
    ort = pytest.importorskip("onnxruntime")
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    fc = rng.standard_normal((4, 5)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["image", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["m"]),
             helper.make_node("Mul", ["m", "scale"], ["y"])]
    graph = helper.make_graph(
        nodes, "cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, "H", "W"]),
         helper.make_tensor_value_info("scale", TensorProto.FLOAT, ["N", 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(fc, "fc")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = str(tmp_path / "cnn.onnx")
    onnx.save(model, path)
    m = kiln.onnx.load(path)
    assert m.inputs[0].shape == [-1, 3, -1, -1]
    exe = m.compile(device="cpu")
    assert exe.is_dynamic
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for n, h, wd in ((1, 8, 8), (3, 12, 7), (1, 8, 8)):
        feeds = {"image": rng.standard_normal((n, 3, h, wd)).astype(np.float32),
                 "scale": rng.standard_normal((n, 1)).astype(np.float32)}
        np.testing.assert_allclose(exe.run(feeds)[0].numpy(), sess.run(None, feeds)[0], rtol=1e-4,
                                   atol=1e-5)
    assert exe.shape_cache()["misses"] == 2 and exe.shape_cache()["hits"] == 1
    with pytest.raises(kiln.ShapeError, match=r"input 'scale' dim 0 is 'N' = 2 \(from 'image'\)"):
        exe.run({"image": np.zeros((2, 3, 8, 8), np.float32), "scale": np.zeros((3, 1), np.float32)})


@pytest.mark.parametrize("k", [1, 64, 256, 257, 700])
def test_matmul_integer_is_exact(rng, k):
    """MatMulInteger against numpy's int64 product: uint8 A with a zero point per tensor or per
    row, int8 or uint8 B with one per tensor or per column, K across the 256-element chunks kiln
    sums in f32 (extreme operands, every element 255 or -128 away from its zero point, included)."""
    cases = [(np.int8, False, False), (np.uint8, True, True), (np.int8, True, False)]
    for b_type, a_zp_rows, b_zp_cols in cases:
        m, n = 5, 3
        a = rng.integers(0, 256, (2, m, k)).astype(np.uint8)
        info = np.iinfo(b_type)
        b = rng.integers(info.min, int(info.max) + 1, (k, n)).astype(b_type)
        a[0, 0] = 255
        b[:, 0] = info.min
        a_zp = (rng.integers(0, 256, (m,)) if a_zp_rows else np.array(0)).astype(np.uint8)
        b_zp = (rng.integers(info.min, int(info.max) + 1, (n,)) if b_zp_cols
                else np.array(info.max if b_type == np.int8 else 0)).astype(b_type)
        if not b_zp_cols:
            b_zp = b_zp.reshape(())
        graph = helper.make_graph(
            [helper.make_node("MatMulInteger", ["a", "b", "a_zp", "b_zp"], ["y"])], "mmi",
            [helper.make_tensor_value_info("a", TensorProto.UINT8, [2, m, k])],
            [helper.make_tensor_value_info("y", TensorProto.INT32, [2, m, n])],
            [numpy_helper.from_array(b, "b"), numpy_helper.from_array(a_zp, "a_zp"),
             numpy_helper.from_array(b_zp, "b_zp")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        got = kiln.onnx.load_bytes(model.SerializeToString()).compile(device="cpu").run(
            {"a": a})[0].numpy()
        a_zp_b = a_zp.astype(np.int64).reshape((m, 1) if a_zp_rows else ())
        want = (a.astype(np.int64) - a_zp_b) @ (b.astype(np.int64) - b_zp.astype(np.int64))
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, want)


def test_dynamic_quantize_linear_matches_the_reference(rng):
    """DynamicQuantizeLinear (y, scale, zero point) against onnx's reference evaluator on fresh
    data of several ranges (all positive, all negative, mixed, one value), with values placed on
    rounding ties of the computed scale."""
    from onnx.reference import ReferenceEvaluator

    graph = helper.make_graph(
        [helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "zp"])], "dql",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [7, 149])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [7, 149]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("zp", TensorProto.UINT8, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    exe = kiln.onnx.load_bytes(model.SerializeToString()).compile(device="cpu")
    ref = ReferenceEvaluator(model)
    for lo, hi in [(0.5, 3.0), (-4.0, -0.25), (-2.0, 5.0), (1.5, 1.5)]:
        x = rng.uniform(lo, hi, (7, 149)).astype(np.float32)
        x[0, 0], x[0, 1] = hi, lo  # the range exactly [min(lo, 0), max(hi, 0)]
        scale = (np.float32(max(hi, 0)) - np.float32(min(lo, 0))) / np.float32(255)
        # values halfway between two steps of that scale (rounding ties, or next to them)
        x[0, 2:22] = (np.arange(20, dtype=np.float32) + np.float32(0.5)) * scale
        got = [o.numpy() for o in exe.run({"x": x})]
        want = ref.run(None, {"x": x})
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_the_onnx_package_works_beside_kiln_imported_first():
    """kiln links its own protobuf and ONNX libraries; imported first, they must not take the
    place of the onnx package's (its checker and reference evaluator crashed when they did). In
    a fresh process, so that a crash fails this test alone."""
    import subprocess
    import sys

    code = """
import numpy as np
import kiln
import onnx
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
m = helper.make_model(helper.make_graph(
    [helper.make_node("Relu", ["x"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])]))
onnx.checker.check_model(m, full_check=True)
x = np.array([-1.0, 0.5, 2.0], np.float32)
want = ReferenceEvaluator(m).run(None, {"x": x})[0]
got = kiln.onnx.load_bytes(m.SerializeToString()).compile(device="cpu").run({"x": x})[0].numpy()
assert np.array_equal(want, got), (want, got)
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stderr[-2000:])
