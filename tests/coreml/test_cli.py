"""The kiln model commands (run, inspect, bench, convert) on a Core ML package made here with
coremltools' MIL builder (its weights in the package's weight file); outputs are checked against
numpy, and the package written by convert runs the same. KILN names the kiln binary (ctest sets
it)."""
import json
import os
import subprocess
import warnings

import numpy as np
import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb

KILN = os.environ.get("KILN", "build/kiln")
RNG = np.random.default_rng()


def kiln(*args):
    return subprocess.run([KILN, *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def scaled(tmp_path_factory):
    """y = relu(x * w + b) over x (3, 40), w and b (40,) stored in the weight file."""
    d = tmp_path_factory.mktemp("coreml")
    w = RNG.standard_normal(40).astype(np.float32)
    b = RNG.standard_normal(40).astype(np.float32)

    @mb.program(input_specs=[mb.TensorSpec(shape=(3, 40))], opset_version=ct.target.iOS16)
    def prog(x):
        return mb.relu(x=mb.add(x=mb.mul(x=x, y=w), y=b), name="y")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS16,
                       compute_precision=ct.precision.FLOAT32,
                       pass_pipeline=ct.PassPipeline.EMPTY)
    path = d / "scaled.mlpackage"
    m.save(str(path))
    return path, w, b


def test_run_inspect_convert(scaled, tmp_path):
    path, w, b = scaled
    x = RNG.standard_normal((3, 40)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    want = np.maximum(x.astype(np.float64) * w + b, 0)
    r = kiln("run", path, "-i", f"x={tmp_path / 'x.npy'}", "-o", tmp_path / "out", "--device",
             "cpu")
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(np.load(tmp_path / "out" / "y.npy"), want, rtol=1e-6, atol=1e-6)

    r = kiln("inspect", path, "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["format"] == "coreml" and "mlProgram" in j["producer"]
    assert [i["name"] for i in j["inputs"]] == ["x"] and j["inputs"][0]["shape"] == [3, 40]
    assert j["op_histogram"] == {"add": 1, "const": 2, "mul": 1, "relu": 1}
    assert j["parameters"]["count"] == 80

    r = kiln("convert", path, "-o", tmp_path / "scaled.kiln")
    assert r.returncode == 0, r.stderr
    r = kiln("run", tmp_path / "scaled.kiln", "-i", f"x={tmp_path / 'x.npy'}", "-o",
             tmp_path / "pkg", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "pkg" / "y.npy"),
                                  np.load(tmp_path / "out" / "y.npy"))

    r = kiln("bench", path, "--device", "cpu", "--iterations", "5", "--warmup", "1")
    assert r.returncode == 0, r.stderr


def test_errors_are_one_line(scaled, tmp_path):
    path, _, _ = scaled
    np.save(tmp_path / "v.npy", np.zeros(3, np.int64))
    for args in (("run", path, "--value", f"x={tmp_path / 'v.npy'}", "--device", "cpu"),
                 ("run", tmp_path / "absent.mlpackage", "--device", "cpu"),
                 ("inspect", path, "--shape", "x=4,40")):
        r = kiln(*args)
        assert r.returncode != 0, r.stdout
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
