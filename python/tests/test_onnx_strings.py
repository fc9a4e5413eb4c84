"""kiln.onnx.Session on models with string values, which kiln's arrays do not hold: the nodes that
read or make strings run on the host between compiled parts (StringNormalizer, StringConcat,
StringSplit, RegexFullMatch, Equal of strings, LabelEncoder), beside ONNX Runtime on fresh
random data."""
import numpy as np
import pytest

import kiln

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

F, I64, S = TensorProto.FLOAT, TensorProto.INT64, TensorProto.STRING


def save(tmp_path, nodes, inputs, outputs, initializers=()):
    model = helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers)),
        opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 9
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return str(path), ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def devices():
    return ["cpu"] + (["cuda"] if kiln.cuda_device_count() > 0 else [])


def same(session, peer, feeds):
    got = session.run(feeds)
    want = peer.run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if w.dtype == object:
            assert isinstance(g, np.ndarray) and g.dtype == object and g.shape == w.shape
            assert g.tolist() == w.tolist()
        else:
            g = g.numpy()
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", devices())
def test_numbers_to_labels_and_back(rng, tmp_path, device):
    # sign of x -> LabelEncoder -> "label_" + it -> upper case -> == "LABEL_POS" -> * x
    path, peer = save(
        tmp_path,
        [helper.make_node("Greater", ["x", "zero"], ["pos"]),
         helper.make_node("Cast", ["pos"], ["pos64"], to=I64),
         helper.make_node("LabelEncoder", ["pos64"], ["label"], domain="ai.onnx.ml",
                          keys_int64s=[0, 1], values_strings=["neg", "pos"],
                          default_string="none"),
         helper.make_node("StringConcat", ["prefix", "label"], ["named"]),
         helper.make_node("StringNormalizer", ["named"], ["upper"], case_change_action="UPPER",
                          locale="C"),
         helper.make_node("Equal", ["upper", "want"], ["is_pos"]),
         helper.make_node("Cast", ["is_pos"], ["gate"], to=F),
         helper.make_node("Mul", ["gate", "x"], ["y"])],
        [helper.make_tensor_value_info("x", F, ["n"])],
        [helper.make_tensor_value_info("upper", S, None),
         helper.make_tensor_value_info("y", F, None)],
        [helper.make_tensor("zero", F, [], [0.0]),
         helper.make_tensor("prefix", S, [], [b"label_"]),
         helper.make_tensor("want", S, [], [b"LABEL_POS"])])
    s = kiln.onnx.Session(path, device=device)
    for n in (5, 9, 2):
        same(s, peer, {"x": rng.standard_normal(n).astype(np.float32)})
    assert s.split


@pytest.mark.parametrize("device", devices())
def test_split_match_and_count_words(rng, tmp_path, device):
    # words of each line, which of them look like e-mail addresses at gmail, and how many words
    words = np.array(["ann@gmail.com", "bob", "x@yahoo.com", "carl@gmail.com", "", "dee"],
                     dtype=object)
    path, peer = save(
        tmp_path,
        [helper.make_node("StringSplit", ["lines"], ["parts", "counts"]),
         helper.make_node("RegexFullMatch", ["parts"], ["gmail"],
                          pattern=r"[\w.\-]{1,25}@gmail\.com"),
         helper.make_node("Cast", ["gmail"], ["g64"], to=I64),
         helper.make_node("ReduceSum", ["g64", "axis"], ["per_line"], keepdims=0),
         helper.make_node("Add", ["per_line", "counts"], ["total"])],
        [helper.make_tensor_value_info("lines", S, ["n"])],
        [helper.make_tensor_value_info("parts", S, None),
         helper.make_tensor_value_info("total", I64, None)],
        [helper.make_tensor("axis", I64, [1], [1])])
    s = kiln.onnx.Session(path, device=device)
    for n in (3, 6, 1):
        lines = np.array([" ".join(rng.choice(words, size=rng.integers(1, 5)))
                          for _ in range(n)], dtype=object)
        same(s, peer, {"lines": lines})


def test_a_string_node_kiln_does_not_run_is_named(tmp_path):
    path, _ = save(
        tmp_path,
        [helper.make_node("Reshape", ["s", "shape"], ["r"])],
        [helper.make_tensor_value_info("s", S, [4])],
        [helper.make_tensor_value_info("r", S, None)],
        [helper.make_tensor("shape", I64, [2], [2, 2])])
    s = kiln.onnx.Session(path, device="cpu")
    with pytest.raises(kiln.UnsupportedError, match="Reshape.*strings"):
        s.run({"s": np.array(["a", "b", "c", "d"], dtype=object)})
