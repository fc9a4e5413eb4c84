"""The kiln model commands (run, inspect, bench, convert) on tiny ONNX models made here with the
onnx package; outputs are checked against numpy. KILN names the kiln binary (ctest sets it).
The same commands on kiln packages: test_cli_package.py."""
import os
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import cli_models

KILN = os.environ.get("KILN", "build/kiln")
RNG = np.random.default_rng()


def kiln(*args):
    return subprocess.run([KILN, *map(str, args)], capture_output=True, text=True, timeout=120)


def assert_one_line_error(r, *fragments):
    assert r.returncode != 0, r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


def save(model, path):
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """Y = relu(X @ W + B) named "mlp/relu", Z = X * 2 named "../twice"; X is (batch, 4)."""
    d = tmp_path_factory.mktemp("mlp")
    w = RNG.standard_normal((4, 3)).astype(np.float32)
    b = RNG.standard_normal(3).astype(np.float32)
    two = np.array(2.0, dtype=np.float32)
    nodes = [helper.make_node("MatMul", ["X", "W"], ["M"]), helper.make_node("Add", ["M", "B"], ["A"]),
             helper.make_node("Relu", ["A"], ["mlp/relu"]), helper.make_node("Mul", ["X", "two"], ["../twice"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 4])],
                          [helper.make_tensor_value_info("mlp/relu", TensorProto.FLOAT, ["batch", 3]),
                           helper.make_tensor_value_info("../twice", TensorProto.FLOAT, ["batch", 4])],
                          [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B"),
                           numpy_helper.from_array(two, "two")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="kiln-test",
                          producer_version="1.0")
    m.ir_version = 8
    return save(m, d / "mlp.onnx"), w, b


@pytest.fixture(scope="module")
def gather_where(tmp_path_factory):
    """Y = where(C, gather(T, I), 0): int64 indices and a bool input."""
    d = tmp_path_factory.mktemp("gw")
    m, t = cli_models.gather_where(RNG)
    return save(m, d / "gw.onnx"), t


def test_help_of_every_command():
    for cmd in ["run", "inspect", "bench", "convert"]:
        r = kiln(cmd, "--help")
        assert r.returncode == 0 and "MODEL" in r.stdout.upper(), r.stdout + r.stderr


def test_run_matches_numpy(mlp, tmp_path):
    path, w, b = mlp
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out"
    r = kiln("run", path, "--input", f"X={tmp_path / 'x.npy'}", "--output-dir", out, "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "mlp/relu" in r.stdout and "(5, 3)" in r.stdout and "f32" in r.stdout and " ms" in r.stdout
    files = sorted(os.listdir(out))
    assert files == ["___twice.npy", "mlp_relu.npy"], files  # names made safe, inside the directory
    y = np.load(out / "mlp_relu.npy")
    ref = np.maximum(x.astype(np.float64) @ w.astype(np.float64) + b, 0.0)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.load(out / "___twice.npy"), 2 * x, rtol=0, atol=0)
    assert not (tmp_path / "twice.npy").exists()


def test_run_int_and_bool_inputs(gather_where, tmp_path):
    path, t = gather_where
    i = RNG.integers(0, 4, size=6).astype(np.int64)
    c = RNG.random((6, 5)) < 0.5
    np.save(tmp_path / "i.npy", i)
    np.save(tmp_path / "c.npy", c)
    r = kiln("run", path, "-i", f"I={tmp_path / 'i.npy'}", "-i", f"C={tmp_path / 'c.npy'}", "-o", tmp_path,
             "--device", "cpu")
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "Y.npy"), np.where(c, t[i], 0.0).astype(np.float32))


def test_run_errors_are_one_line(mlp, tmp_path):
    path, _, _ = mlp
    np.save(tmp_path / "x.npy", RNG.standard_normal((2, 4)).astype(np.float32))
    np.save(tmp_path / "wrong_shape.npy", RNG.standard_normal((2, 5)).astype(np.float32))
    np.save(tmp_path / "wrong_dtype.npy", RNG.standard_normal((2, 4)))  # float64
    x = f"X={tmp_path / 'x.npy'}"
    assert_one_line_error(kiln("run", path, "-i", f"X={tmp_path / 'wrong_shape.npy'}", "--device", "cpu"))
    assert_one_line_error(kiln("run", path, "-i", f"X={tmp_path / 'wrong_dtype.npy'}", "--device", "cpu"))
    assert_one_line_error(kiln("run", path, "-i", x, "-i", f"Q={tmp_path / 'x.npy'}", "--device", "cpu"), "Q")
    assert_one_line_error(kiln("run", path, "-i", f"X={tmp_path / 'absent.npy'}", "--device", "cpu"))
    assert_one_line_error(kiln("run", tmp_path / "absent.onnx", "-i", x, "--device", "cpu"))
    assert_one_line_error(kiln("run", path, "-i", "X", "--device", "cpu"), "NAME=")
    assert_one_line_error(kiln("run", path, "-i", x, "--device", "tpu"))
    (tmp_path / "text.onnx").write_text("not a model\n")
    assert_one_line_error(kiln("run", tmp_path / "text.onnx", "-i", x, "--device", "cpu"))
    assert_one_line_error(kiln("run"))  # a CLI11 parse error is one line too


def test_run_random_inputs(mlp, tmp_path):
    """Inputs not given are random (seeded, dim_params 1 unless --shape fixes them)."""
    path, w, b = mlp
    r = kiln("run", path, "--shape", "X=3,4", "--seed", 5, "-o", tmp_path / "a", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "input X" in r.stdout and "(3, 4) (random)" in r.stdout, r.stdout
    x = np.load(tmp_path / "a" / "___twice.npy") / 2  # the random input, recovered exactly
    assert x.shape == (3, 4) and np.all(np.abs(x) <= 1) and len(np.unique(x)) == 12, x
    ref = np.maximum(x.astype(np.float64) @ w.astype(np.float64) + b, 0.0)
    np.testing.assert_allclose(np.load(tmp_path / "a" / "mlp_relu.npy"), ref, rtol=1e-5, atol=1e-6)
    r = kiln("run", path, "--seed", 5, "-o", tmp_path / "b", "--device", "cpu")
    assert r.returncode == 0 and "(1, 4) (random)" in r.stdout, r.stdout + r.stderr
    r = kiln("run", path, "--shape", "X=3,4", "--seed", 6, "-o", tmp_path / "c", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert not np.array_equal(np.load(tmp_path / "c" / "___twice.npy"), 2 * x)


def test_inspect(mlp):
    path, _, _ = mlp
    r = kiln("inspect", path, "--device", "cpu")
    assert r.returncode == 0, r.stderr
    for s in ["opset 17", "kiln-test", "batch=1", "MatMul", "Relu", "parameters: 16", "CPU fallbacks: none",
              "on cpu"]:
        assert s in r.stdout, (s, r.stdout)
    r = kiln("inspect", path, "--shape", "X=7,4", "--device", "cpu")
    assert r.returncode == 0 and "batch=7" in r.stdout, r.stdout + r.stderr
    assert_one_line_error(kiln("inspect", path, "--shape", "X=7,a", "--device", "cpu"), "--shape")
    assert_one_line_error(kiln("inspect", path, "--shape", "Nope=1,4", "--device", "cpu"), "Nope")


def test_bench(mlp, gather_where):
    r = kiln("bench", mlp[0], "--iterations", 5, "--warmup", 1, "--shape", "X=8,4", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    for s in ["p50", "p90", "p99", "mean", "runs/s", "items/s (batch 8)"]:
        assert s in r.stdout, (s, r.stdout)
    r = kiln("bench", gather_where[0], "-n", 3, "--device", "cpu")  # random indices stay in range
    assert r.returncode == 0, r.stderr
    assert_one_line_error(kiln("bench", mlp[0], "-n", 0, "--device", "cpu"), "iterations")


def test_convert(mlp, tmp_path):
    path, _, _ = mlp
    r = kiln("convert", path)
    assert r.returncode == 0 and "valid" in r.stdout, r.stdout + r.stderr
    r = kiln("convert", path, "-o", tmp_path / "mlp.kiln")
    assert r.returncode == 0 and "MatMul" in r.stdout, r.stdout + r.stderr  # the report came first
    data = (tmp_path / "mlp.kiln").read_bytes()
    assert len(data) > 64 and data[:4] == b"KILN", data[:8]
    assert_one_line_error(kiln("convert", path, "-o", tmp_path / "no" / "such" / "dir.kiln"), "")


def test_convert_keeps_dim_params_dynamic(mlp, tmp_path):
    """Without --shape the package keeps its dim_params dynamic and runs any batch; with one it
    is fixed."""
    path, w, b = mlp
    r = kiln("convert", path, "-o", tmp_path / "dyn.kiln")
    assert r.returncode == 0 and "dims without --shape stay dynamic" in r.stdout, r.stdout + r.stderr
    r = kiln("inspect", tmp_path / "dyn.kiln", "--device", "cpu")
    assert r.returncode == 0 and "batch=?" in r.stdout, r.stdout + r.stderr
    for n in (1, 6):
        x = RNG.standard_normal((n, 4)).astype(np.float32)
        np.save(tmp_path / "x.npy", x)
        r = kiln("run", tmp_path / "dyn.kiln", "-i", f"X={tmp_path / 'x.npy'}", "-o", tmp_path / f"o{n}",
                 "--device", "cpu")
        assert r.returncode == 0, r.stderr
        want = np.maximum(x.astype(np.float64) @ w + b, 0)
        np.testing.assert_allclose(np.load(tmp_path / f"o{n}" / "mlp_relu.npy"), want, rtol=1e-5, atol=1e-5)
    r = kiln("convert", path, "--shape", "X=2,4", "-o", tmp_path / "fixed.kiln")
    assert r.returncode == 0 and "stay dynamic" not in r.stdout, r.stdout + r.stderr


def test_value_fixes_an_input_needed_while_importing(tmp_path):
    """Reshape whose target shape is a graph input: --value gives it while importing."""
    g = helper.make_graph([helper.make_node("Reshape", ["X", "S"], ["Y"])], "rs",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 6]),
                           helper.make_tensor_value_info("S", TensorProto.INT64, [2])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path = save(m, tmp_path / "rs.onnx")
    x = RNG.standard_normal((2, 6)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "s.npy", np.array([3, 4], np.int64))
    r = kiln("run", path, "-i", f"X={tmp_path / 'x.npy'}", "--value", f"S={tmp_path / 's.npy'}", "-o", tmp_path,
             "--device", "cpu")
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "Y.npy"), x.reshape(3, 4))
    assert_one_line_error(kiln("inspect", path, "--device", "cpu"), "S")
    r = kiln("inspect", path, "--value", f"S={tmp_path / 's.npy'}", "--device", "cpu")
    assert r.returncode == 0 and "(3, 4)" in r.stdout, r.stdout + r.stderr
    # an --input array of an input the import needs is its value
    np.save(tmp_path / "s2.npy", np.array([4, 3], np.int64))
    r = kiln("run", path, "-i", f"X={tmp_path / 'x.npy'}", "-i", f"S={tmp_path / 's2.npy'}", "-o",
             tmp_path / "given", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "given" / "Y.npy"), x.reshape(4, 3))
