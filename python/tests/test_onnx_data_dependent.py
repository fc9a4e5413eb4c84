"""kiln.onnx.Session on models with a node whose outputs' sizes depend on values computed at run
time (NonZero, Unique, Compress, NonMaxSuppression): the model is split there, the node runs on
the host between the parts, and the part after it compiles once for every count. Beside ONNX
Runtime on fresh random data, several runs with different counts."""
import numpy as np
import pytest

import kiln

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def save(tmp_path, nodes, inputs, outputs, initializers=(), opset=17):
    model = helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers)),
        opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return str(path), ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def devices():
    ds = ["cpu"]
    if kiln.cuda_device_count() > 0:
        ds.append("cuda")
    return ds


def same(session, peer, feeds, rtol=1e-5, atol=1e-6):
    got = session.run(feeds)
    want = peer.run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g = g.numpy()
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return got


@pytest.mark.parametrize("device", devices())
def test_nonzero_of_a_computed_mask(rng, tmp_path, device):
    # nz = NonZero(x > 0); y = GatherND(x, nzᵀ) * 2; s = ReduceSum(x) (beside the split)
    path, peer = save(
        tmp_path,
        [helper.make_node("Greater", ["x", "zero"], ["m"]),
         helper.make_node("NonZero", ["m"], ["nz"]),
         helper.make_node("Transpose", ["nz"], ["t"]),
         helper.make_node("GatherND", ["x", "t"], ["g"]),
         helper.make_node("Mul", ["g", "two"], ["y"]),
         helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0)],
        [helper.make_tensor_value_info("x", F, ["n", 5])],
        [helper.make_tensor_value_info("nz", I64, None),
         helper.make_tensor_value_info("y", F, None),
         helper.make_tensor_value_info("s", F, None)],
        [helper.make_tensor("zero", F, [], [0.0]), helper.make_tensor("two", F, [], [2.0])])
    s = kiln.onnx.Session(path, device=device)
    assert s.split
    counts = set()
    for n in (3, 7, 3, 1):
        x = rng.standard_normal((n, 5)).astype(np.float32)
        got = same(s, peer, {"x": x})
        counts.add(got[0].numpy().shape[1])
    assert len(counts) > 1  # (the counts differed between runs)
    # one import of the part before the node, one of the part after it (dynamic: every count),
    # and one of the node for each run's values
    assert s.imports == 1 + 1 + 4
    assert s.output_names == ["nz", "y", "s"]


@pytest.mark.parametrize("device", devices())
def test_unique_of_computed_values_feeds_more_nodes(rng, tmp_path, device):
    # Unique(Round(|x| * 2)) and counts * 3
    path, peer = save(
        tmp_path,
        [helper.make_node("Abs", ["x"], ["a"]),
         helper.make_node("Mul", ["a", "two"], ["b"]),
         helper.make_node("Round", ["b"], ["r"]),
         helper.make_node("Unique", ["r"], ["u", "first", "inverse", "counts"], sorted=1),
         helper.make_node("Mul", ["counts", "three"], ["c3"]),
         helper.make_node("Gather", ["u", "inverse"], ["back"])],
        [helper.make_tensor_value_info("x", F, ["n"])],
        [helper.make_tensor_value_info(o, t, None)
         for o, t in [("u", F), ("first", I64), ("inverse", I64), ("c3", I64), ("back", F)]],
        [helper.make_tensor("two", F, [], [2.0]), helper.make_tensor("three", I64, [], [3])])
    s = kiln.onnx.Session(path, device=device)
    for n in (9, 20, 5):
        same(s, peer, {"x": rng.standard_normal(n).astype(np.float32)})
    assert s.split and s.imports == 1 + 1 + 3


@pytest.mark.parametrize("device", devices())
def test_compress_by_a_computed_condition(rng, tmp_path, device):
    # rows of x whose mean is positive, through a relu
    path, peer = save(
        tmp_path,
        [helper.make_node("ReduceMean", ["x"], ["mean"], axes=[1], keepdims=0),
         helper.make_node("Greater", ["mean", "zero"], ["keep"]),
         helper.make_node("Compress", ["x", "keep"], ["c"], axis=0),
         helper.make_node("Relu", ["c"], ["y"])],
        [helper.make_tensor_value_info("x", F, ["n", 4])],
        [helper.make_tensor_value_info("y", F, None)],
        [helper.make_tensor("zero", F, [], [0.0])])
    s = kiln.onnx.Session(path, device=device)
    for n in (6, 11, 2, 6):
        same(s, peer, {"x": rng.standard_normal((n, 4)).astype(np.float32)})
    assert s.split


@pytest.mark.parametrize("device", devices())
def test_non_max_suppression_of_computed_boxes_and_scores(rng, tmp_path, device):
    # boxes = |raw| (corners in either order), scores = sigmoid(logits); the selected boxes
    # gathered by their indices
    path, peer = save(
        tmp_path,
        [helper.make_node("Abs", ["raw"], ["boxes"]),
         helper.make_node("Sigmoid", ["logits"], ["scores"]),
         helper.make_node("NonMaxSuppression",
                          ["boxes", "scores", "max_out", "iou", "score_min"], ["sel"]),
         helper.make_node("Gather", ["sel", "col"], ["idx"], axis=1),
         helper.make_node("Squeeze", ["boxes", "axis0"], ["b2"]),
         helper.make_node("Gather", ["b2", "idx"], ["picked"], axis=0)],
        [helper.make_tensor_value_info("raw", F, [1, "n", 4]),
         helper.make_tensor_value_info("logits", F, [1, 1, "n"])],
        [helper.make_tensor_value_info("sel", I64, None),
         helper.make_tensor_value_info("picked", F, None)],
        [helper.make_tensor("max_out", I64, [1], [4]), helper.make_tensor("iou", F, [1], [0.3]),
         helper.make_tensor("score_min", F, [1], [0.4]), helper.make_tensor("col", I64, [], [2]),
         helper.make_tensor("axis0", I64, [1], [0])])
    s = kiln.onnx.Session(path, device=device)
    counts = set()
    for n in (8, 3, 12, 8):
        feeds = {"raw": (rng.random((1, n, 4)) * 4).astype(np.float32),
                 "logits": rng.standard_normal((1, 1, n)).astype(np.float32)}
        counts.add(same(s, peer, feeds)[0].numpy().shape[0])
    assert len(counts) > 1
    assert s.split


@pytest.mark.parametrize("device", devices())
def test_roi_align_of_computed_rois_feeds_a_convolution(rng, tmp_path, device):
    # rois made from the image's features (adaptive grids: each sized by its roi), then a conv
    # over the pooled features, whose channels the part after the split must know
    path, peer = save(
        tmp_path,
        [helper.make_node("Relu", ["x"], ["feat"]),
         helper.make_node("Abs", ["r"], ["rois"]),
         helper.make_node("RoiAlign", ["feat", "rois", "idx"], ["pooled"], output_height=3,
                          output_width=3, sampling_ratio=0, spatial_scale=0.5),
         helper.make_node("Conv", ["pooled", "w"], ["y"], kernel_shape=[3, 3])],
        [helper.make_tensor_value_info("x", F, [1, 4, "h", "w_"]),
         helper.make_tensor_value_info("r", F, ["k", 4]),
         helper.make_tensor_value_info("idx", I64, ["k"])],
        [helper.make_tensor_value_info("y", F, None)],
        [helper.make_tensor("w", F, [2, 4, 3, 3],
                            rng.standard_normal(72).astype(np.float32).tolist())])
    s = kiln.onnx.Session(path, device=device)
    for k, h, w in ((3, 10, 12), (5, 10, 12), (2, 14, 9)):
        corners = rng.random((k, 2)) * 6
        r = np.concatenate([corners, corners + 2 + rng.random((k, 2)) * 8], axis=1)
        feeds = {"x": rng.standard_normal((1, 4, h, w)).astype(np.float32),
                 "r": r.astype(np.float32), "idx": np.zeros(k, np.int64)}
        same(s, peer, feeds, rtol=1e-4, atol=1e-5)
    assert s.split


def test_split_off_imports_the_whole_model_per_value(rng, tmp_path):
    path, peer = save(
        tmp_path,
        [helper.make_node("Greater", ["x", "zero"], ["m"]),
         helper.make_node("NonZero", ["m"], ["nz"])],
        [helper.make_tensor_value_info("x", F, [6])],
        [helper.make_tensor_value_info("nz", I64, None)],
        [helper.make_tensor("zero", F, [], [0.0])])
    s = kiln.onnx.Session(path, device="cpu", split_at_data_dependent_nodes=False)
    for _ in range(3):
        same(s, peer, {"x": rng.standard_normal(6).astype(np.float32)})
    assert not s.split and s.value_inputs == ["x"]


def test_a_data_dependent_node_in_a_loop_body_is_imported_per_value(rng, tmp_path):
    # NonZero inside an If branch: no split (the node is in a subgraph); the graph input behind
    # it is read from each run's feeds instead
    branch = helper.make_graph(
        [helper.make_node("NonZero", ["x"], ["nz"])], "then", [],
        [helper.make_tensor_value_info("nz", I64, None)])
    other = helper.make_graph(
        [helper.make_node("NonZero", ["x"], ["nz2"])], "else", [],
        [helper.make_tensor_value_info("nz2", I64, None)])
    path, peer = save(
        tmp_path,
        [helper.make_node("If", ["c"], ["out"], then_branch=branch, else_branch=other)],
        [helper.make_tensor_value_info("x", F, [5]),
         helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("out", I64, None)])
    s = kiln.onnx.Session(path, device="cpu")
    for _ in range(2):
        x = np.where(rng.random(5) < 0.5, 0, 1).astype(np.float32)
        same(s, peer, {"x": x, "c": np.array(True)})
    assert not s.split


@pytest.mark.parametrize("device", devices())
def test_two_data_dependent_nodes_split_twice(rng, tmp_path, device):
    # Compress(x, x > 0) feeds Unique(Round(c)): the part after the first split splits again;
    # an output of the first part ("m") and a graph input passed through ("x") are outputs too
    path, peer = save(
        tmp_path,
        [helper.make_node("Greater", ["x", "zero"], ["m"]),
         helper.make_node("Compress", ["x", "m"], ["c"], axis=0),
         helper.make_node("Round", ["c"], ["r"]),
         helper.make_node("Unique", ["r"], ["u", "first", "inverse", "counts"], sorted=1),
         helper.make_node("ReduceSum", ["counts"], ["total"], keepdims=0),
         helper.make_node("Identity", ["x"], ["x_out"])],
        [helper.make_tensor_value_info("x", F, ["n"])],
        [helper.make_tensor_value_info("u", F, None),
         helper.make_tensor_value_info("total", I64, None),
         helper.make_tensor_value_info("m", TensorProto.BOOL, None),
         helper.make_tensor_value_info("x_out", F, None)],
        [helper.make_tensor("zero", F, [], [0.0])])
    s = kiln.onnx.Session(path, device=device)
    for n in (10, 4, 17):
        same(s, peer, {"x": (rng.standard_normal(n) * 3).astype(np.float32)})
    assert s.split


def test_a_missing_feed_is_named(rng, tmp_path):
    path, _ = save(
        tmp_path,
        [helper.make_node("Greater", ["x", "y"], ["m"]),
         helper.make_node("NonZero", ["m"], ["nz"])],
        [helper.make_tensor_value_info("x", F, [4]), helper.make_tensor_value_info("y", F, [4])],
        [helper.make_tensor_value_info("nz", I64, None)])
    s = kiln.onnx.Session(path, device="cpu")
    with pytest.raises(ValueError, match="'y'"):
        s.run({"x": np.ones(4, np.float32)})
