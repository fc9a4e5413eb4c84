"""ONNX sequences (SequenceConstruct, SequenceInsert, SequenceErase, SequenceAt, SequenceLength,
SplitToSequence, ConcatFromSequence, SequenceMap; sequences carried by Loop and given by If;
sequence-typed graph inputs and outputs) run through kiln.onnx.Session beside ONNX Runtime on
fresh random data, and optional-typed inputs and outputs against numpy. kiln holds a sequence while importing as the list of its elements, so a
sequence input's length and shapes, and the positions and trip counts around sequences, select
an import (src/io/onnx/ops_sequence.cpp)."""
import numpy as np
import pytest

import kiln

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

F = TensorProto.FLOAT
I64 = TensorProto.INT64


def seq_info(name, elem=F):
    return helper.make_tensor_sequence_value_info(name, elem, None)


def tensor_info(name, elem=F, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def i64(name, *values, scalar=False):
    v = np.array(values[0] if scalar else list(values), np.int64)
    return helper.make_tensor(name, I64, v.shape, v.ravel().tolist())


def model_of(nodes, inputs, outputs, inits=(), opset=17):
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def run_both(tmp_path, model, feeds, runs=1):
    """Runs `model` in ONNX Runtime and in a kiln Session; compares every output (a sequence
    element by element). Returns the session."""
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ks = kiln.onnx.Session(str(path), device="cpu")
    for feed in feeds if isinstance(feeds, list) else [feeds]:
        want = sess.run(None, feed)
        got = ks.run(feed)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            if isinstance(w, list):
                assert isinstance(g, list) and len(g) == len(w)
                for ge, we in zip(g, w):
                    assert ge.shape == we.shape
                    np.testing.assert_allclose(ge.numpy(), we, rtol=1e-6, atol=1e-6)
            else:
                assert g.shape == w.shape
                np.testing.assert_allclose(g.numpy(), w, rtol=1e-6, atol=1e-6)
    return ks


@pytest.mark.parametrize("insert_at", [None, 0, 1, -1, 2])
@pytest.mark.parametrize("erase_at", [None, 0, -2])
def test_construct_insert_erase_at_length_concat(rng, tmp_path, insert_at, erase_at):
    nodes = [helper.make_node("SequenceConstruct", ["a", "b"], ["s0"])]
    inits = []
    if insert_at is None:
        nodes.append(helper.make_node("SequenceInsert", ["s0", "c"], ["s1"]))
    else:
        inits.append(i64("p", insert_at, scalar=True))
        nodes.append(helper.make_node("SequenceInsert", ["s0", "c", "p"], ["s1"]))
    if erase_at is None:
        nodes.append(helper.make_node("SequenceErase", ["s1"], ["s2"]))
    else:
        inits.append(i64("q", erase_at, scalar=True))
        nodes.append(helper.make_node("SequenceErase", ["s1", "q"], ["s2"]))
    inits.append(i64("last", -1, scalar=True))
    nodes += [helper.make_node("SequenceAt", ["s2", "last"], ["at"]),
              helper.make_node("SequenceLength", ["s1"], ["n"]),
              helper.make_node("ConcatFromSequence", ["s2"], ["cat"], axis=0),
              helper.make_node("Identity", ["s2"], ["s"])]
    model = model_of(nodes, [tensor_info("a", F, [2, 3]), tensor_info("b", F, [4, 3]),
                             tensor_info("c", F, [1, 3])],
                     [tensor_info("at"), tensor_info("n", I64), tensor_info("cat"), seq_info("s")],
                     inits)
    feeds = {k: rng.standard_normal(s).astype(np.float32)
             for k, s in [("a", (2, 3)), ("b", (4, 3)), ("c", (1, 3))]}
    run_both(tmp_path, model, feeds)


@pytest.mark.parametrize("split, keepdims", [(None, 1), (None, 0), (3, 1), ([2, 2, 3], 1),
                                             ([0, 7, 0], 1)])
def test_split_to_sequence(rng, tmp_path, split, keepdims):
    inits, ins = [], ["x"]
    if split is not None:
        inits.append(i64("split", split, scalar=True) if np.isscalar(split)
                     else i64("split", *split))
        ins.append("split")
    nodes = [helper.make_node("SplitToSequence", ins, ["s"], axis=1, keepdims=keepdims),
             helper.make_node("SequenceLength", ["s"], ["n"])]
    model = model_of(nodes, [tensor_info("x", F, [5, 7])], [seq_info("s"), tensor_info("n", I64)],
                     inits)
    run_both(tmp_path, model, {"x": rng.standard_normal((5, 7)).astype(np.float32)})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat_from_sequence_on_a_new_axis(rng, tmp_path, axis):
    nodes = [helper.make_node("SplitToSequence", ["x"], ["s"], axis=0, keepdims=0),
             helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=axis, new_axis=1)]
    model = model_of(nodes, [tensor_info("x", F, [4, 3, 2])], [tensor_info("y")])
    run_both(tmp_path, model, {"x": rng.standard_normal((4, 3, 2)).astype(np.float32)})


def test_sequence_input_and_map_import_once_per_length_and_shapes(rng, tmp_path):
    body = helper.make_graph(
        [helper.make_node("Add", ["e", "t"], ["sum"]), helper.make_node("Shape", ["e"], ["shp"])],
        "body", [tensor_info("e", F, None), tensor_info("t", F, [1])],
        [tensor_info("sum"), tensor_info("shp", I64)])
    nodes = [helper.make_node("SequenceMap", ["xs", "t"], ["sums", "shapes"], body=body)]
    model = model_of(nodes, [seq_info("xs"), tensor_info("t", F, [1])],
                     [seq_info("sums"), seq_info("shapes", I64)])

    def feed(*shapes):
        return {"xs": [rng.standard_normal(s).astype(np.float32) for s in shapes],
                "t": rng.standard_normal(1).astype(np.float32)}

    feeds = [feed((2, 3), (4,)), feed((2, 3), (4,)), feed((5,), (1, 2), (3, 3, 1))]
    ks = run_both(tmp_path, model, feeds)
    assert ks.imports == 2  # one per length and element shapes, not per data
    assert ks.value_inputs == ["xs"]


def test_loop_carrying_a_sequence_with_a_scan_output(rng, tmp_path):
    # for i < M: s.insert(x[:i + 1] * i); acc += i; scan out acc
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["i", "one"], ["end"]),
         helper.make_node("Unsqueeze", ["end", "zero"], ["end1"]),
         helper.make_node("Slice", ["x", "zero", "end1"], ["row"]),
         helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mul", ["row", "fi"], ["scaled"]),
         helper.make_node("SequenceInsert", ["s_in", "scaled"], ["s_out"]),
         helper.make_node("Add", ["acc_in", "fi"], ["acc_out"]),
         helper.make_node("Identity", ["acc_out"], ["scan"])],
        "body", [tensor_info("i", I64, []), tensor_info("cond_in", TensorProto.BOOL, []),
                 seq_info("s_in"), tensor_info("acc_in", F, [])],
        [tensor_info("cond_out", TensorProto.BOOL, []), seq_info("s_out"),
         tensor_info("acc_out", F, []), tensor_info("scan", F, [])],
        [i64("one", 1, scalar=True), i64("zero", 0)])
    nodes = [helper.make_node("SequenceEmpty", [], ["s0"], dtype=F),
             helper.make_node("Loop", ["M", "go", "s0", "acc0"], ["s", "acc", "scans"], body=body),
             helper.make_node("ConcatFromSequence", ["s"], ["cat"], axis=0)]
    model = model_of(nodes, [tensor_info("M", I64, []), tensor_info("go", TensorProto.BOOL, []),
                             tensor_info("x", F, [6]), tensor_info("acc0", F, [])],
                     [seq_info("s"), tensor_info("acc"), tensor_info("scans"),
                      tensor_info("cat")])

    def feed(m):
        return {"M": np.array(m, np.int64), "go": np.array(True), "x":
                rng.standard_normal(6).astype(np.float32),
                "acc0": rng.standard_normal(()).astype(np.float32)}

    ks = run_both(tmp_path, model, [feed(3), feed(5), feed(3)])
    assert ks.imports == 2


def test_if_giving_sequences_of_different_lengths(rng, tmp_path):
    then = helper.make_graph([helper.make_node("SequenceConstruct", ["a", "b"], ["s_then"])],
                             "then", [], [seq_info("s_then")])
    other = helper.make_graph([helper.make_node("SequenceConstruct", ["b"], ["s_else"])],
                              "else", [], [seq_info("s_else")])
    nodes = [helper.make_node("If", ["c"], ["s"], then_branch=then, else_branch=other),
             helper.make_node("SequenceLength", ["s"], ["n"])]
    model = model_of(nodes, [tensor_info("c", TensorProto.BOOL, []), tensor_info("a", F, [3]),
                             tensor_info("b", F, [2, 2])], [seq_info("s"), tensor_info("n", I64)])

    def feed(c):
        return {"c": np.array(c), "a": rng.standard_normal(3).astype(np.float32),
                "b": rng.standard_normal((2, 2)).astype(np.float32)}

    ks = run_both(tmp_path, model, [feed(True), feed(False)])
    assert ks.value_inputs == ["c"]


def test_sequence_errors_name_the_node_and_the_value(rng, tmp_path):
    nodes = [helper.make_node("SequenceConstruct", ["a"], ["s0"]),
             helper.make_node("SequenceAt", ["s0", "p"], ["y"])]
    model = model_of(nodes, [tensor_info("a", F, [3])], [tensor_info("y")],
                     [i64("p", 1, scalar=True)])
    with pytest.raises(kiln.ValueError, match=r"position 1 is out of range for a sequence of 1"):
        kiln.onnx.load_bytes(model.SerializeToString())
    # a sequence input needs its elements: a plain run names it
    nodes = [helper.make_node("SequenceLength", ["xs"], ["n"])]
    path = tmp_path / "len.onnx"
    path.write_bytes(model_of(nodes, [seq_info("xs")], [tensor_info("n", I64)])
                     .SerializeToString())
    ks = kiln.onnx.Session(str(path), device="cpu")
    with pytest.raises(kiln.ValueError, match=r"input 'xs' has no feed"):
        ks.run({})
    got = ks.run({"xs": [np.zeros(2, np.float32)] * 4})
    assert got[0].numpy() == 4
    with pytest.raises(kiln.UnsupportedError, match=r"input 'xs' is a sequence"):
        kiln.onnx.load(str(path))


def test_optional_inputs_with_and_without_a_value(rng, tmp_path):
    """An optional input fed a value or None (numpy expectations): OptionalHasElement says which,
    an If on it picks a branch, and an optional output passes the value on, or None."""
    opt = helper.make_tensor_type_proto(F, [3])
    opt_info = helper.make_value_info("x", helper.make_optional_type_proto(opt))
    out_info = helper.make_value_info("y", helper.make_optional_type_proto(opt))
    then = helper.make_graph([helper.make_node("OptionalGetElement", ["x"], ["got"]),
                              helper.make_node("Mul", ["got", "two"], ["t_out"])],
                             "then", [], [tensor_info("t_out", F, [3])])
    other = helper.make_graph([helper.make_node("Identity", ["zeros"], ["e_out"])],
                              "else", [], [tensor_info("e_out", F, [3])])
    nodes = [helper.make_node("OptionalHasElement", ["x"], ["has"]),
             helper.make_node("If", ["has"], ["z"], then_branch=then, else_branch=other),
             helper.make_node("Identity", ["x"], ["y"])]
    inits = [helper.make_tensor("two", F, [], [2.0]), helper.make_tensor("zeros", F, [3], [0] * 3)]
    model = model_of(nodes, [opt_info], [tensor_info("has", TensorProto.BOOL, []),
                                         tensor_info("z", F, [3]), out_info], inits, opset=18)
    path = tmp_path / "opt.onnx"
    path.write_bytes(model.SerializeToString())
    ks = kiln.onnx.Session(str(path), device="cpu")
    x = rng.standard_normal(3).astype(np.float32)
    has, z, y = ks.run({"x": x})
    assert bool(has.numpy()) and np.array_equal(z.numpy(), x * 2) and np.array_equal(y.numpy(), x)
    has, z, y = ks.run({"x": None})
    assert not bool(has.numpy()) and np.array_equal(z.numpy(), np.zeros(3, np.float32))
    assert y is None
    assert ks.imports == 2


def test_loop_slicing_at_its_iteration_number_unrolls(rng, tmp_path):
    """A Loop whose body slices a tensor at its iteration number (bounds known only per
    iteration) is unrolled while importing, its trip count read from the feeds: beside ONNX
    Runtime at two trip counts, one import each."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["i", "one"], ["end"]),
         helper.make_node("Unsqueeze", ["i", "zero"], ["start1"]),
         helper.make_node("Unsqueeze", ["end", "zero"], ["end1"]),
         helper.make_node("Slice", ["table", "start1", "end1"], ["row"]),
         helper.make_node("Add", ["acc_in", "row"], ["acc_out"]),
         helper.make_node("Identity", ["acc_out"], ["scan"])],
        "body", [tensor_info("i", I64, []), tensor_info("cond_in", TensorProto.BOOL, []),
                 tensor_info("acc_in", F, [1, 4])],
        [tensor_info("cond_out", TensorProto.BOOL, []), tensor_info("acc_out", F, [1, 4]),
         tensor_info("scan", F, [1, 4])],
        [i64("one", 1, scalar=True), i64("zero", 0)])
    nodes = [helper.make_node("Loop", ["M", "", "acc0"], ["acc", "scans"], body=body)]
    model = model_of(nodes, [tensor_info("M", I64, []), tensor_info("table", F, [9, 4]),
                             tensor_info("acc0", F, [1, 4])],
                     [tensor_info("acc", F, [1, 4]), tensor_info("scans")], opset=13)

    def feed(m):
        return {"M": np.array(m, np.int64), "table": rng.standard_normal((9, 4)).astype(np.float32),
                "acc0": rng.standard_normal((1, 4)).astype(np.float32)}

    ks = run_both(tmp_path, model, [feed(3), feed(7), feed(3)])
    assert ks.value_inputs == ["M"] and ks.imports == 2


def test_load_takes_sequence_shapes_and_absent_inputs(rng):
    """kiln.onnx.load_bytes with sequence_inputs (each element an input 'xs[k]') and
    absent_inputs; Model.graph_outputs groups a sequence output's elements."""
    nodes = [helper.make_node("SequenceInsert", ["xs", "t"], ["ys"]),
             helper.make_node("OptionalHasElement", ["o"], ["has"])]
    opt = helper.make_value_info("o", helper.make_optional_type_proto(
        helper.make_tensor_type_proto(F, [2])))
    model = model_of(nodes, [seq_info("xs"), tensor_info("t", F, [3]), opt],
                     [seq_info("ys"), tensor_info("has", TensorProto.BOOL, [])], opset=18)
    data = model.SerializeToString()
    with pytest.raises(kiln.UnsupportedError, match=r"input 'xs' is a sequence"):
        kiln.onnx.load_bytes(data)
    m = kiln.onnx.load_bytes(data, sequence_inputs={"xs": [[3], [3]]}, absent_inputs=["o"])
    assert [i.name for i in m.inputs] == ["xs[0]", "xs[1]", "t"]
    assert [i.sequence for i in m.inputs] == ["xs", "xs", ""]
    ys, has = m.graph_outputs
    assert isinstance(ys, kiln.onnx.GraphOutput)
    assert ys.sequence and (ys.first, ys.count) == (0, 3) and not has.sequence
    assert not ys.absent and not has.absent and has.name == "has"
    exe = m.compile(device="cpu")
    a, b, t = (rng.standard_normal(3).astype(np.float32) for _ in range(3))
    out = exe.run({"xs[0]": a, "xs[1]": b, "t": t})
    for got, want in zip(out[:3], [a, b, t]):
        np.testing.assert_array_equal(got.numpy(), want)
    assert not bool(out[3].numpy())
    with pytest.raises(kiln.ValueError, match=r"no optional input 'nope'"):
        kiln.onnx.load_bytes(data, sequence_inputs={"xs": []}, absent_inputs=["nope"])
