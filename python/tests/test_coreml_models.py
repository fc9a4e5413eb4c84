"""Core ML models of real architectures (tests/data/coreml, made by scripts/make_coreml_models.py:
small PyTorch models converted by coremltools with its default passes) run by kiln on the CPU
and, where there is one, a CUDA device, against PyTorch's outputs stored beside them. Neither
PyTorch nor coremltools is needed here."""
import pathlib

import numpy as np
import pytest
from conftest import cuda_available

import kiln

DATA = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "coreml"
DEVICES = ["cpu"] + (["cuda"] if cuda_available() else [])

# (model, rtol, atol): f32 models within a few units of float rounding over their sums; the fp16
# model computes in fp16 against PyTorch's f32 (10 bits of mantissa over a layer)
MODELS = [("cnn", 1e-4, 1e-5), ("cnn_palettized", 1e-4, 1e-5), ("encoder", 1e-4, 1e-4),
          ("encoder_fp16", 2e-2, 2e-2), ("gpt_block", 1e-4, 1e-4),
          ("gpt_block_ios18", 1e-4, 1e-4), ("tagger", 1e-4, 1e-5)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,rtol,atol", MODELS)
def test_converted_models_match_pytorch(name, rtol, atol, device):
    m = kiln.coreml.load(str(DATA / f"{name}.mlpackage"))
    ref = np.load(DATA / f"{name}.npz")
    # (an fp16 model may take fp16 inputs)
    feeds = {i.name: ref[i.name].astype(np.float16 if i.dtype == kiln.f16 else ref[i.name].dtype)
             for i in m.inputs}
    outs = m.compile(device=device).run(feeds)
    assert len(outs) == len([k for k in ref.files if k.startswith("out")])
    for k, o in enumerate(outs):
        np.testing.assert_allclose(o.numpy().astype(np.float64), ref[f"out{k}"], rtol=rtol,
                                   atol=atol)


def test_palettized_model_holds_its_weights_compressed():
    m = kiln.coreml.load(str(DATA / "cnn_palettized.mlpackage"))
    assert m.op_histogram.get("constexpr_lut_to_dense", 0) >= 2
    dense = kiln.coreml.load(str(DATA / "cnn.mlpackage"))
    assert "constexpr_lut_to_dense" not in dense.op_histogram
    stored = sum(p.stat().st_size for p in (DATA / "cnn_palettized.mlpackage").rglob("weight.bin"))
    assert stored * 4 < m.parameter_bytes  # 4-bit indices for the f32 weights they expand to
