"""Real models exported with dynamic dims (scripts/onnx_models.py --dynamic, kept in
tests/data/onnx_models_dynamic): kiln imports each without shapes, compiles one dynamic executable
and runs it at shapes other than the exported ones, against onnxruntime on the same inputs."""
import os

import numpy as np
import pytest

import kiln

ort = pytest.importorskip("onnxruntime")

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "onnx_models_dynamic")
MODELS = sorted(d for d in os.listdir(DATA) if os.path.isfile(os.path.join(DATA, d, "model.onnx")))
# (batch, seq) for token models, (batch, height, width) for image models; the exports used
# (2, 16), (2, 12) and (2 or 1, 64, 64): every shape here is another
TOKEN_SHAPES = [(1, 5), (3, 20), (2, 9)]
IMAGE_SHAPES = [(1, 48, 48), (3, 80, 64), (2, 32, 96)]
VOCAB = {"bert": 1000, "gpt2": 1000, "tagger": 500, "llama": 300}


def feeds_for(name, sess, shape, rng):
    feeds = {}
    for inp in sess.get_inputs():
        if inp.name == "attention_mask":
            m = np.ones(shape, np.int64)
            m[0, shape[1] // 2 + 1:] = 0  # one padded sequence
            feeds[inp.name] = m
        elif inp.type == "tensor(int64)":
            vocab = next(v for k, v in VOCAB.items() if k in name)
            feeds[inp.name] = rng.integers(0, vocab, shape).astype(np.int64)
        elif inp.shape[2:] == [32, 32]:  # a ViT: its patch grid is fixed
            feeds[inp.name] = rng.standard_normal((shape[0], 3, 32, 32)).astype(np.float32)
        else:
            b, h, w = shape
            feeds[inp.name] = rng.standard_normal((b, 3, h, w)).astype(np.float32)
    return feeds


@pytest.mark.parametrize("name", MODELS)
def test_dynamic_model_runs_at_other_shapes(name, rng):
    path = os.path.join(DATA, name, "model.onnx")
    m = kiln.onnx.load(path)
    assert any(d < 0 for i in m.inputs for d in i.shape), m.inputs
    exe = m.compile(device="cpu")
    assert exe.is_dynamic
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    image = sess.get_inputs()[0].type == "tensor(float)"
    shapes = IMAGE_SHAPES if image else TOKEN_SHAPES
    for shape in shapes + shapes[:1]:
        feeds = feeds_for(name, sess, shape, rng)
        want = sess.run(None, feeds)
        got = [o.numpy() for o in exe.run(feeds)]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape, (shape, g.shape, w.shape)
            # float32 against float32: sums of up to a few thousand products
            np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4 * max(1.0, float(np.abs(w).max())))
    c = exe.shape_cache()
    assert c["misses"] == len(shapes) and c["hits"] == 1
