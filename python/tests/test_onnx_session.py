"""kiln.onnx.Session: models whose shapes, starts, repeats or trip counts are graph inputs run as
given, their values read from each run's feeds (one import per distinct set of values), beside
ONNX Runtime on fresh random data."""
import numpy as np
import pytest

import kiln

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def save(tmp_path, nodes, inputs, outputs, opset=17):
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return str(path), ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def same(session, peer, feeds, rtol=1e-5, atol=1e-6):
    got = session.run(feeds)
    want = peer.run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.numpy().shape == w.shape
        np.testing.assert_allclose(g.numpy(), w, rtol=rtol, atol=atol)


def test_reshape_tile_and_slice_take_run_time_values(rng, tmp_path):
    # y = Slice(Tile(Reshape(x, shape), repeats), starts, ends, axes)
    path, peer = save(
        tmp_path,
        [helper.make_node("Reshape", ["x", "shape"], ["r"]),
         helper.make_node("Tile", ["r", "repeats"], ["t"]),
         helper.make_node("Slice", ["t", "starts", "ends", "axes"], ["y"])],
        [helper.make_tensor_value_info("x", F, ["n", 12]),
         helper.make_tensor_value_info("shape", I64, [3]),
         helper.make_tensor_value_info("repeats", I64, [3]),
         helper.make_tensor_value_info("starts", I64, [1]),
         helper.make_tensor_value_info("ends", I64, [1]),
         helper.make_tensor_value_info("axes", I64, [1])],
        [helper.make_tensor_value_info("y", F, None)])
    s = kiln.onnx.Session(path, device="cpu")
    plans = [((2, 3, 4), (1, 2, 1), 1, 5, 1), ((2, 4, 3), (2, 1, 2), 0, 3, 0),
             ((2, 3, 4), (1, 2, 1), 1, 5, 1), ((4, 6, 1), (1, 1, 3), -2, 100, 2)]
    for shape, repeats, start, end, axis in plans:
        n = shape[0] * shape[1] * shape[2] // 12
        feeds = {"x": rng.standard_normal((n, 12)).astype(np.float32),
                 "shape": np.array(shape, np.int64), "repeats": np.array(repeats, np.int64),
                 "starts": np.array([start], np.int64), "ends": np.array([end], np.int64),
                 "axes": np.array([axis], np.int64)}
        same(s, peer, feeds)
    assert set(s.value_inputs) == {"shape", "repeats", "starts", "ends", "axes"}
    assert s.imports == 3  # the first plan's values came back: its import was kept
    assert s.kept == 3


def test_range_and_loop_outputs_sized_by_values(rng, tmp_path):
    # r = Range(0, limit, 1) as floats; a Loop of M iterations with a scan output of x * i
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mul", ["x", "fi"], ["row"]),
         helper.make_node("Add", ["acc_in", "row"], ["acc_out"])],
        "body",
        [helper.make_tensor_value_info("i", I64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", F, [4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", F, [4]),
         helper.make_tensor_value_info("row", F, [4])])
    path, peer = save(
        tmp_path,
        [helper.make_node("Range", ["zero", "limit", "one"], ["r"]),
         helper.make_node("Loop", ["M", "", "acc0"], ["acc", "rows"], body=body)],
        [helper.make_tensor_value_info("zero", F, []),
         helper.make_tensor_value_info("limit", F, []),
         helper.make_tensor_value_info("one", F, []),
         helper.make_tensor_value_info("M", I64, []),
         helper.make_tensor_value_info("x", F, [4]),
         helper.make_tensor_value_info("acc0", F, [4])],
        [helper.make_tensor_value_info("r", F, None),
         helper.make_tensor_value_info("acc", F, None),
         helper.make_tensor_value_info("rows", F, None)])
    s = kiln.onnx.Session(path, device="cpu")
    for limit, m in ((5.0, 3), (2.5, 0), (7.0, 6)):
        feeds = {"zero": np.array(0, np.float32), "limit": np.array(limit, np.float32),
                 "one": np.array(1, np.float32), "M": np.array(m, np.int64),
                 "x": rng.standard_normal(4).astype(np.float32),
                 "acc0": rng.standard_normal(4).astype(np.float32)}
        same(s, peer, feeds)
    assert "M" in s.value_inputs and "limit" in s.value_inputs
    # a new x with the same values reuses the import
    before = s.imports
    feeds["x"] = rng.standard_normal(4).astype(np.float32)
    same(s, peer, feeds)
    assert s.imports == before


def test_errors_and_the_import_bound(rng, tmp_path):
    path, peer = save(
        tmp_path, [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        [helper.make_tensor_value_info("x", F, [6]), helper.make_tensor_value_info("shape", I64, [2])],
        [helper.make_tensor_value_info("y", F, None)])
    s = kiln.onnx.Session(path, device="cpu", max_imports=1)
    x = rng.standard_normal(6).astype(np.float32)
    with pytest.raises(kiln.ValueError, match="input 'shape' has no feed"):
        s.run({"x": x})
    for shape in ((2, 3), (3, 2), (2, 3)):
        same(s, peer, {"x": x, "shape": np.array(shape, np.int64)})
    assert s.imports == 3 and s.kept == 1  # one kept: (2, 3) was imported again
    with pytest.raises(kiln.ShapeError):
        s.run({"x": x, "shape": np.array((4, 2), np.int64)})
    with pytest.raises(kiln.ValueError, match="no input 'z'"):
        s.run({"x": x, "shape": np.array((2, 3), np.int64), "z": x})
    with pytest.raises(kiln.IoError):
        kiln.onnx.Session(str(tmp_path / "missing.onnx"), device="cpu")


def test_import_names_the_inputs_it_needs(tmp_path):
    path, _ = save(
        tmp_path,
        [helper.make_node("Add", ["shape", "one"], ["s1"]),
         helper.make_node("Reshape", ["x", "s1"], ["y"])],
        [helper.make_tensor_value_info("x", F, [6]), helper.make_tensor_value_info("shape", I64, [2]),
         helper.make_tensor_value_info("one", I64, [2])],
        [helper.make_tensor_value_info("y", F, None)])
    with pytest.raises(kiln.UnsupportedError, match="comes from graph input 'shape', 'one'"):
        kiln.onnx.load(path)
    s = kiln.onnx.Session(path, device="cpu")
    x = np.arange(6, dtype=np.float32)
    got = s.run({"x": x, "shape": np.array((1, 2), np.int64), "one": np.array((1, 1), np.int64)})
    np.testing.assert_array_equal(got[0].numpy(), x.reshape(2, 3))
    assert s.value_inputs == ["shape", "one"]
