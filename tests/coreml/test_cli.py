"""The kiln model commands (run, inspect, bench, convert, profile) on a Core ML package made here
with coremltools' MIL builder (its weights in the package's weight file), and run, inspect and
convert on an .mlmodel file (a NeuralNetwork) made with its NeuralNetworkBuilder; outputs are
checked against numpy, and the packages written by convert run the same. KILN names the kiln
binary (ctest sets it)."""
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
    from coremltools.models import datatypes
    from coremltools.models.neural_network import NeuralNetworkBuilder

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


@pytest.fixture(scope="module")
def network(tmp_path_factory):
    """A NeuralNetwork .mlmodel: y = ip(flatten(relu(conv3x3(x) + cb))) + ib over x (3, 6, 6),
    4 output channels (valid padding: 4 x 4), ip 64 -> 5 (the builder's multiArrays are f64)."""
    d = tmp_path_factory.mktemp("coreml_nn")
    cw = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    cb = RNG.standard_normal(4).astype(np.float32)
    iw = RNG.standard_normal((5, 64)).astype(np.float32)
    ib = RNG.standard_normal(5).astype(np.float32)
    b = NeuralNetworkBuilder([("x", datatypes.Array(3, 6, 6))], [("y", datatypes.Array(5))])
    b.add_convolution("conv", 3, 4, 3, 3, 1, 1, "valid", 1, cw.transpose(2, 3, 1, 0), cb, True,
                      input_name="x", output_name="c")
    b.add_activation("relu", "RELU", "c", "r")
    b.add_flatten("flat", 0, "r", "f")
    b.add_inner_product("ip", iw, ib, 64, 5, True, "f", "y")
    path = d / "net.mlmodel"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ct.utils.save_spec(b.spec, str(path))
    return path, (cw, cb, iw, ib)


def network_ref(x, cw, cb, iw, ib):
    """The network in float64: a valid 3 x 3 convolution by windows, relu, flatten (C, H, W)."""
    win = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(1, 2))  # (3, 4, 4, 3, 3)
    conv = np.einsum("chwij,ocij->ohw", win, cw.astype(np.float64)) + cb[:, None, None]
    return iw.astype(np.float64) @ np.maximum(conv, 0).reshape(-1) + ib


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


def test_profile(scaled, tmp_path):
    path, w, b = scaled
    x = RNG.standard_normal((3, 40)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    trace, html = tmp_path / "trace.json", tmp_path / "report.html"
    r = kiln("profile", path, "-i", f"x={tmp_path / 'x.npy'}", "--device", "cpu", "--runs", 3,
             "--warmup", 1, "--trace", trace, "--html", html)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith(f"{path} on cpu: import + compile") and "3 profiled runs" in out
    assert "CPU fallbacks: none" in out and f"wrote the trace to {trace}" in out
    # the op table: one row per kernel, its calls the profiled runs (the warmup's dropped)
    table = out.split("top ops by total time", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    rows = [line.split() for line in table]
    assert rows and all(row[-1] == "(cpu)" and int(row[1]) == 3 for row in rows), out
    events = json.loads(trace.read_text())["traceEvents"]
    runs = [e for e in events if e.get("cat") == "run"]
    ops = [e for e in events if e.get("cat") == "op"]
    assert sorted(e["args"]["run"] for e in runs) == [0, 1, 2]
    assert {e["name"] for e in ops} == {row[3] for row in rows}
    assert len(ops) == 3 * len(rows) and all(e["ph"] == "X" and e["dur"] >= 0 for e in ops)
    assert any(e.get("cat") == "compile" for e in events)
    assert html.read_text().lstrip().lower().startswith("<!doctype html>")


def test_neural_network_run_inspect_convert(network, tmp_path):
    path, weights = network
    x = RNG.standard_normal((3, 6, 6))
    np.save(tmp_path / "x.npy", x)
    want = network_ref(x, *weights)
    r = kiln("run", path, "-i", f"x={tmp_path / 'x.npy'}", "-o", tmp_path / "out", "--device",
             "cpu")
    assert r.returncode == 0, r.stderr
    got = np.load(tmp_path / "out" / "y.npy")
    assert got.dtype == np.float64 and got.shape == (5,)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)  # the layers compute in f32

    r = kiln("inspect", path, "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["format"] == "coreml" and "neuralNetwork" in j["producer"]
    assert j["inputs"] == [{"name": "x", "dtype": "f64", "shape": [3, 6, 6],
                            "dim_params": ["", "", ""]}]
    assert [(o["name"], o["dtype"], o["shape"]) for o in j["outputs"]] == [("y", "f64", [5])]
    assert j["op_histogram"] == {"activation": 1, "convolution": 1, "flatten": 1,
                                 "innerProduct": 1}
    assert j["parameters"]["count"] == 4 * 3 * 3 * 3 + 4 + 5 * 64 + 5
    r = kiln("inspect", path)
    assert r.returncode == 0 and "innerProduct" in r.stdout, r.stderr

    r = kiln("convert", path, "-o", tmp_path / "net.kiln")
    assert r.returncode == 0, r.stderr
    r = kiln("run", tmp_path / "net.kiln", "-i", f"x={tmp_path / 'x.npy'}", "-o",
             tmp_path / "pkg", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "pkg" / "y.npy"), got)

    # a feed of another dtype: one line, in the Core ML importer's words
    np.save(tmp_path / "x32.npy", x.astype(np.float32))
    r = kiln("run", path, "-i", f"x={tmp_path / 'x32.npy'}", "--device", "cpu")
    assert r.returncode != 0, r.stdout
    assert r.stderr.strip() == "error: [coreml] input 'x' takes f64, got f32", r.stderr


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
