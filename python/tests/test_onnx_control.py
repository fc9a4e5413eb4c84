"""ONNX If, Loop and Scan (kiln's cond, while_loop and for_loop) against onnxruntime, on models
built with onnx.helper whose conditions and trip counts are run-time inputs."""
import numpy as np
import pytest

import kiln

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def model_of(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "control", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def both(model, feeds, tmp_path):
    path = str(tmp_path / "m.onnx")
    onnx.save(model, path)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    exe = kiln.onnx.load(path).compile(device=kiln.default_device())
    got = [a.numpy() for a in exe.run(feeds)]
    return got, want


def test_if_with_a_run_time_condition(rng, tmp_path):
    w = rng.standard_normal(4).astype(np.float32)
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", F, [3, 4])])
    else_g = helper.make_graph([helper.make_node("Sub", ["x", "w"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", F, [3, 4])])
    m = model_of([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                  helper.make_node("Greater", ["s", "zero"], ["c"]),
                  helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
                 [helper.make_tensor_value_info("x", F, [3, 4])],
                 [helper.make_tensor_value_info("y", F, [3, 4])],
                 [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.float32(0), "zero")])
    for sign in (1, -1):
        x = (np.abs(rng.standard_normal((3, 4))) * sign).astype(np.float32)
        got, want = both(m, {"x": x}, tmp_path)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6)


def loop_model(scan):
    # i, cond, acc -> cond_out = acc_sum < limit, acc = acc * 1.5 + i (as float)
    nodes = [helper.make_node("Cast", ["i"], ["fi"], to=F),
             helper.make_node("Mul", ["acc_in", "k"], ["scaled"]),
             helper.make_node("Add", ["scaled", "fi"], ["acc_out"]),
             helper.make_node("ReduceSum", ["acc_out"], ["s"], keepdims=0),
             helper.make_node("Less", ["s", "limit"], ["cond_out"])]
    outs = [helper.make_tensor_value_info("cond_out", B, []),
            helper.make_tensor_value_info("acc_out", F, [3])]
    if scan:
        nodes[-1] = helper.make_node("Identity", ["cond_in"], ["cond_out"])
        nodes.append(helper.make_node("Mul", ["acc_out", "acc_out"], ["sq"]))
        outs.append(helper.make_tensor_value_info("sq", F, [3]))
    body = helper.make_graph(nodes, "body", [helper.make_tensor_value_info("i", I64, []),
                                             helper.make_tensor_value_info("cond_in", B, []),
                                             helper.make_tensor_value_info("acc_in", F, [3])], outs,
                             [numpy_helper.from_array(np.float32(1.5), "k")])
    ins = ["M" if not scan else "Mc", "c0", "acc0"]
    loop_outs = ["acc"] + (["stack"] if scan else [])
    nodes = [helper.make_node("Loop", ins, loop_outs, body=body)]
    inits = [numpy_helper.from_array(np.int64(5), "Mc"), numpy_helper.from_array(np.bool_(True), "c0")] if scan else []
    inputs = [helper.make_tensor_value_info("acc0", F, [3]), helper.make_tensor_value_info("limit", F, [])]
    if not scan:
        inputs += [helper.make_tensor_value_info("M", I64, []), helper.make_tensor_value_info("c0", B, [])]
    outputs = [helper.make_tensor_value_info("acc", F, [3])]
    if scan:
        outputs.append(helper.make_tensor_value_info("stack", F, [5, 3]))
    return model_of(nodes, inputs, outputs, inits)


def test_loop_with_run_time_trip_count_and_condition(rng, tmp_path):
    m = loop_model(scan=False)
    for bound in (0, 3, 50):
        feeds = {"acc0": rng.uniform(0.1, 1, 3).astype(np.float32), "limit": np.array(rng.uniform(20, 200), np.float32),
                 "M": np.array(bound, np.int64), "c0": np.array(True)}
        got, want = both(m, feeds, tmp_path)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5)


def test_loop_with_scan_outputs(rng, tmp_path):
    m = loop_model(scan=True)
    feeds = {"acc0": rng.standard_normal(3).astype(np.float32), "limit": np.array(0, np.float32)}
    got, want = both(m, feeds, tmp_path)
    assert got[1].shape == (5, 3)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5)


@pytest.mark.parametrize("reverse", [0, 1])
def test_scan_over_an_axis(rng, tmp_path, reverse):
    body = helper.make_graph([helper.make_node("Add", ["s_in", "xt"], ["s_out"]),
                              helper.make_node("Tanh", ["s_out"], ["y"])], "body",
                             [helper.make_tensor_value_info("s_in", F, [2]),
                              helper.make_tensor_value_info("xt", F, [2])],
                             [helper.make_tensor_value_info("s_out", F, [2]),
                              helper.make_tensor_value_info("y", F, [2])])
    node = helper.make_node("Scan", ["s0", "x"], ["s", "ys"], body=body, num_scan_inputs=1,
                            scan_input_axes=[1], scan_input_directions=[reverse], scan_output_axes=[1])
    m = model_of([node], [helper.make_tensor_value_info("s0", F, [2]), helper.make_tensor_value_info("x", F, [2, 6])],
                 [helper.make_tensor_value_info("s", F, [2]), helper.make_tensor_value_info("ys", F, [2, 6])])
    feeds = {"s0": rng.standard_normal(2).astype(np.float32), "x": rng.standard_normal((2, 6)).astype(np.float32)}
    got, want = both(m, feeds, tmp_path)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def scan8_model(batch, steps, lens=None):
    """Scan-8: states (batch, 2), scan inputs (batch, steps, 2) twice (the second reversed); the
    body adds both steps into the state and emits tanh of it and the product of the steps."""
    body = helper.make_graph([helper.make_node("Add", ["s_in", "a"], ["t"]),
                              helper.make_node("Add", ["t", "b"], ["s_out"]),
                              helper.make_node("Tanh", ["s_out"], ["y"]),
                              helper.make_node("Mul", ["a", "b"], ["p"])], "body",
                             [helper.make_tensor_value_info("s_in", F, [2]),
                              helper.make_tensor_value_info("a", F, [2]),
                              helper.make_tensor_value_info("b", F, [2])],
                             [helper.make_tensor_value_info("s_out", F, [2]),
                              helper.make_tensor_value_info("y", F, [2]),
                              helper.make_tensor_value_info("p", F, [2])])
    node = helper.make_node("Scan", ["lens" if lens is not None else "", "s0", "xa", "xb"],
                            ["s", "ys", "ps"], body=body, num_scan_inputs=2, directions=[0, 1])
    inits = [numpy_helper.from_array(np.array(lens, np.int64), "lens")] if lens is not None else []
    return model_of([node],
                    [helper.make_tensor_value_info("s0", F, [batch, 2]),
                     helper.make_tensor_value_info("xa", F, [batch, steps, 2]),
                     helper.make_tensor_value_info("xb", F, [batch, steps, 2])],
                    [helper.make_tensor_value_info("s", F, [batch, 2]),
                     helper.make_tensor_value_info("ys", F, [batch, steps, 2]),
                     helper.make_tensor_value_info("ps", F, [batch, steps, 2])], inits, opset=8)


@pytest.mark.parametrize("batch,lens", [(1, None), (3, None), (2, [5, 5])])
def test_scan8_scans_each_batch_element(rng, tmp_path, batch, lens):
    m = scan8_model(batch, 5, lens)
    feeds = {"s0": rng.standard_normal((batch, 2)).astype(np.float32),
             "xa": rng.standard_normal((batch, 5, 2)).astype(np.float32),
             "xb": rng.standard_normal((batch, 5, 2)).astype(np.float32)}
    got, want = both(m, feeds, tmp_path)
    assert [g.shape for g in got] == [(batch, 2), (batch, 5, 2), (batch, 5, 2)]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_scan8_refuses_sequences_shorter_than_their_steps(tmp_path):
    path = str(tmp_path / "m.onnx")
    onnx.save(scan8_model(2, 5, [5, 3]), path)
    with pytest.raises(kiln.UnsupportedError,
                       match="sequence_lens holds 3 for sequences of 5 steps"):
        kiln.onnx.load(path)


def test_scan8_with_a_dynamic_batch_and_steps(rng, tmp_path):
    path = str(tmp_path / "m.onnx")
    onnx.save(scan8_model("N", "T"), path)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    exe = kiln.onnx.load(path).compile(device=kiln.default_device())
    for batch, steps in ((1, 4), (3, 6), (2, 1)):
        feeds = {"s0": rng.standard_normal((batch, 2)).astype(np.float32),
                 "xa": rng.standard_normal((batch, steps, 2)).astype(np.float32),
                 "xb": rng.standard_normal((batch, steps, 2)).astype(np.float32)}
        got, want = [a.numpy() for a in exe.run(feeds)], sess.run(None, feeds)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
