"""`kiln run`, `inspect` and `bench` on kiln packages written by `kiln convert -o`: outputs are
compared with ONNX Runtime and, bit for bit, with the same commands on the ONNX file. KILN names
the kiln binary (ctest sets it)."""
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import cli_models

KILN = os.environ.get("KILN", "build/kiln")
RNG = np.random.default_rng()
CORPUS = Path(__file__).resolve().parents[1] / "fuzz" / "package_corpus"


def kiln(*args):
    return subprocess.run([KILN, *map(str, args)], capture_output=True, text=True, timeout=120)


def assert_clean_error(r, *fragments):
    """Exit status 1 (not a signal), one line "error: ..." on stderr holding every fragment."""
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for f in fragments:
        assert str(f) in lines[0], (f, lines[0])


def onnxruntime_outputs(path, feeds):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def fnv1a64(path):
    h = 1469598103934665603
    for byte in Path(path).read_bytes():
        h = ((h ^ byte) * 1099511628211) % (1 << 64)
    return f"fnv1a64:{h:016x}"


def convert(onnx_path, out, *shapes):
    args = ["convert", onnx_path, "-o", out]
    for s in shapes:
        args += ["--shape", s]
    r = kiln(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """A = X @ W + B named "../affine", Y = relu(A) named "mlp/relu", Z = X * 2 named "twice";
    X is (batch, 4). The package is compiled for batch 5."""
    d = tmp_path_factory.mktemp("mlp")
    w = RNG.standard_normal((4, 3)).astype(np.float32)
    b = RNG.standard_normal(3).astype(np.float32)
    two = np.array(2.0, dtype=np.float32)
    nodes = [helper.make_node("MatMul", ["X", "W"], ["M"]), helper.make_node("Add", ["M", "B"], ["../affine"]),
             helper.make_node("Relu", ["../affine"], ["mlp/relu"]), helper.make_node("Mul", ["X", "two"], ["twice"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 4])],
                          [helper.make_tensor_value_info("mlp/relu", TensorProto.FLOAT, ["batch", 3]),
                           helper.make_tensor_value_info("../affine", TensorProto.FLOAT, ["batch", 3]),
                           helper.make_tensor_value_info("twice", TensorProto.FLOAT, ["batch", 4])],
                          [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B"),
                           numpy_helper.from_array(two, "two")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="kiln-test")
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, str(d / "mlp.onnx"))
    return d / "mlp.onnx", convert(d / "mlp.onnx", d / "mlp.kiln", "X=5,4")


@pytest.fixture(scope="module")
def gather_where(tmp_path_factory):
    """Y = where(C, gather(T, I), 0): int64 indices and a bool input; compiled for n = 6."""
    d = tmp_path_factory.mktemp("gw")
    m, t = cli_models.gather_where(RNG)
    onnx.save(m, str(d / "gw.onnx"))
    return d / "gw.onnx", convert(d / "gw.onnx", d / "gw.kiln", "I=6", "C=6,5")


def run_outputs(model, out_dir, *args):
    r = kiln("run", model, "-o", out_dir, "--device", "cpu", *args)
    assert r.returncode == 0, r.stdout + r.stderr
    return {f: np.load(out_dir / f) for f in sorted(os.listdir(out_dir))}, r.stdout


def assert_bit_identical(a, b):
    assert a.keys() == b.keys(), (a.keys(), b.keys())
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert a[k].tobytes() == b[k].tobytes(), k


def test_run_package_matches_onnxruntime_and_the_onnx_file(mlp, tmp_path):
    onnx_path, pkg = mlp
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    from_pkg, stdout = run_outputs(pkg, tmp_path / "pkg", "-i", f"X={tmp_path / 'x.npy'}")
    assert "mlp/relu" in stdout and "(5, 3)" in stdout and "(given)" in stdout and "load" in stdout, stdout
    assert sorted(from_pkg) == ["___affine.npy", "mlp_relu.npy", "twice.npy"]  # ONNX output names, made safe
    ref = onnxruntime_outputs(onnx_path, {"X": x})
    np.testing.assert_allclose(from_pkg["mlp_relu.npy"], ref["mlp/relu"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(from_pkg["___affine.npy"], ref["../affine"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(from_pkg["twice.npy"], ref["twice"])
    from_onnx, _ = run_outputs(onnx_path, tmp_path / "onnx", "-i", f"X={tmp_path / 'x.npy'}")
    assert_bit_identical(from_pkg, from_onnx)


def test_run_package_int_and_bool_inputs(gather_where, tmp_path):
    onnx_path, pkg = gather_where
    i = RNG.integers(0, 4, size=6).astype(np.int64)
    c = RNG.random((6, 5)) < 0.5
    np.save(tmp_path / "i.npy", i)
    np.save(tmp_path / "c.npy", c)
    feeds = ["-i", f"I={tmp_path / 'i.npy'}", "-i", f"C={tmp_path / 'c.npy'}"]
    from_pkg, _ = run_outputs(pkg, tmp_path / "pkg", *feeds)
    np.testing.assert_array_equal(from_pkg["Y.npy"], onnxruntime_outputs(onnx_path, {"I": i, "C": c})["Y"])
    from_onnx, _ = run_outputs(onnx_path, tmp_path / "onnx", *feeds)
    assert_bit_identical(from_pkg, from_onnx)


def test_random_inputs_are_the_same_for_the_package_and_the_onnx_file(mlp, tmp_path):
    onnx_path, pkg = mlp
    from_pkg, stdout = run_outputs(pkg, tmp_path / "pkg", "--seed", 7)
    assert "(random)" in stdout and "(5, 4)" in stdout, stdout
    from_onnx, _ = run_outputs(onnx_path, tmp_path / "onnx", "--seed", 7, "--shape", "X=5,4")
    assert_bit_identical(from_pkg, from_onnx)
    other, _ = run_outputs(pkg, tmp_path / "other", "--seed", 8)
    assert other["twice.npy"].tobytes() != from_pkg["twice.npy"].tobytes()


def test_package_is_found_by_its_magic_bytes(mlp, tmp_path):
    _, pkg = mlp
    renamed = tmp_path / "model.onnx"  # a package whatever its name
    shutil.copy(pkg, renamed)
    a, _ = run_outputs(pkg, tmp_path / "a", "--seed", 3)
    b, stdout = run_outputs(renamed, tmp_path / "b", "--seed", 3)
    assert "load" in stdout, stdout
    assert_bit_identical(a, b)
    (tmp_path / "notes.bin").write_text("neither a package nor a model\n")
    assert_clean_error(kiln("run", tmp_path / "notes.bin", "--device", "cpu"), "notes.bin", "neither")
    assert_clean_error(kiln("inspect", tmp_path / "absent.kiln", "--device", "cpu"), "absent.kiln")
    assert_clean_error(kiln("inspect", tmp_path, "--device", "cpu"), "directory")


def test_inspect_package(mlp):
    onnx_path, pkg = mlp
    r = kiln("inspect", pkg, "--device", "cpu")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    # the version the file says it is (u32 at offset 8 of the header), independently of inspect
    version = int.from_bytes(Path(pkg).read_bytes()[8:12], "little")
    for s in [f"format version {version}", "written by kiln ", "producer kiln convert", fnv1a64(onnx_path),
              "compiled for cpu, loaded for cpu as compiled", "variables: none", "kernels per op",
              "matmul", "CPU fallbacks: none", f"file: {pkg.stat().st_size} bytes", "intermediate memory"]:
        assert s in out, (s, out)
    lines = out.splitlines()
    inputs = lines[lines.index("inputs:") + 1:lines.index("outputs:")]
    assert len(inputs) == 1 and inputs[0].split() == ["X", "f32", "(5,", "4)"], inputs
    outputs = lines[lines.index("outputs:") + 1:lines.index("outputs:") + 4]
    assert [o.split()[:2] for o in outputs] == [["mlp/relu", "f32"], ["../affine", "f32"], ["twice", "f32"]]
    r = kiln("inspect", pkg, "--device", "cpu", "--dump", "--no-verify-weights")
    assert r.returncode == 0 and "program:" in r.stdout and "@output0" in r.stdout, r.stdout + r.stderr


def test_inspect_json(mlp):
    onnx_path, pkg = mlp
    r = kiln("inspect", pkg, "--json", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["format"] == "kiln-package" and j["format_version"] == int.from_bytes(Path(pkg).read_bytes()[8:12], "little") and j["producer"] == "kiln convert"
    assert j["source_hash"] == fnv1a64(onnx_path) and j["compiled_for"] == "cpu" and j["replanned"] is False
    assert j["inputs"] == [{"name": "X", "dtype": "f32", "shape": [5, 4]}]
    assert [(o["name"], o["shape"]) for o in j["outputs"]] == [("mlp/relu", [5, 3]), ("../affine", [5, 3]),
                                                               ("twice", [5, 4])]
    assert j["variables"] == [] and j["sizes"]["file"] == pkg.stat().st_size
    assert j["kernels"] == sum(j["kernels_per_backend"].values()) and j["cpu_fallbacks"] == []
    r = kiln("inspect", CORPUS / "variable.kiln", "--json", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["variables"] == [{"name": "v", "dtype": "f32", "shape": [3], "bytes": 12}]
    r = kiln("inspect", onnx_path, "--json", "--shape", "X=2,4", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["format"] == "onnx" and j["opset"] == 17 and j["producer"] == "kiln-test"
    assert j["inputs"] == [{"name": "X", "dtype": "f32", "shape": [2, 4], "dim_params": ["batch", ""]}]
    assert j["op_histogram"] == {"Add": 1, "MatMul": 1, "Mul": 1, "Relu": 1}
    assert j["parameters"] == {"count": 16, "bytes": 64}


def test_inspect_package_with_a_variable():
    r = kiln("inspect", CORPUS / "variable.kiln", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "variables: 1" in r.stdout and "  v " in r.stdout and "assign" in r.stdout, r.stdout
    assert "producer (none)" in r.stdout, r.stdout


def test_bench_package(mlp, gather_where):
    onnx_path, pkg = mlp
    r = kiln("bench", pkg, "-n", 5, "-w", 1, "--device", "cpu")
    assert r.returncode == 0, r.stderr
    for s in ["load: ", "compiled for cpu", "p50", "p90", "p99", "mean", "runs/s", "items/s (batch 5)", "(random)"]:
        assert s in r.stdout, (s, r.stdout)
    assert "import + compile" not in r.stdout
    r = kiln("bench", onnx_path, "-n", 5, "-w", 1, "--device", "cpu")
    assert r.returncode == 0 and "import + compile: " in r.stdout, r.stdout + r.stderr
    r = kiln("bench", gather_where[1], "-n", 3, "--device", "cpu")  # random indices stay in range
    assert r.returncode == 0, r.stderr


def test_onnx_only_options_on_a_package(mlp, tmp_path):
    _, pkg = mlp
    np.save(tmp_path / "x54.npy", RNG.standard_normal((5, 4)).astype(np.float32))
    np.save(tmp_path / "x24.npy", RNG.standard_normal((2, 4)).astype(np.float32))
    np.save(tmp_path / "x54_f64.npy", RNG.standard_normal((5, 4)))
    for cmd in ["run", "inspect", "bench"]:
        assert_clean_error(kiln(cmd, pkg, "--shape", "X=2,4", "--device", "cpu"), "--shape X=2,4", "(5, 4)",
                           pkg.name)
        assert_clean_error(kiln(cmd, pkg, "--value", f"X={tmp_path / 'x54.npy'}", "--device", "cpu"), "--value",
                           pkg.name)
        assert_clean_error(kiln(cmd, pkg, "--shape", "Q=1", "--device", "cpu"), "Q")
    r = kiln("run", pkg, "--shape", "X=5,4", "-o", tmp_path, "--device", "cpu")  # agrees: fine
    assert r.returncode == 0, r.stderr
    assert_clean_error(kiln("run", pkg, "-i", f"X={tmp_path / 'x24.npy'}", "--device", "cpu"), "(2, 4)", "(5, 4)")
    assert_clean_error(kiln("run", pkg, "-i", f"X={tmp_path / 'x54_f64.npy'}", "--device", "cpu"), "f64", "f32")
    assert_clean_error(kiln("run", pkg, "-i", f"Q={tmp_path / 'x54.npy'}", "--device", "cpu"), "Q")


def test_package_only_options_on_an_onnx_file(mlp):
    onnx_path, _ = mlp
    for flag in ["--strict", "--no-verify-weights"]:
        assert_clean_error(kiln("run", onnx_path, flag, "--device", "cpu"), flag, onnx_path.name)


def test_strict_refuses_another_kind_of_device(mlp):
    _, pkg = mlp
    # checked before the device is opened, so the same with or without a GPU
    assert_clean_error(kiln("run", pkg, "--device", "cuda", "--strict"), "--strict", pkg.name, "compiled for cpu")
    assert_clean_error(kiln("inspect", pkg, "--device", "cuda", "--strict"), "--strict")


def test_replanned_for_a_gpu(mlp, tmp_path):
    onnx_path, pkg = mlp
    r = kiln("inspect", pkg, "--device", "cuda")
    if r.returncode != 0 and "not available" in r.stderr:
        pytest.skip("no GPU")
    assert r.returncode == 0, r.stderr
    assert "compiled for cpu, loaded for cuda:0: placed and planned again" in r.stdout, r.stdout
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = kiln("run", pkg, "-i", f"X={tmp_path / 'x.npy'}", "-o", tmp_path, "--device", "cuda")
    assert r.returncode == 0 and "placed and planned again" in r.stdout, r.stdout + r.stderr
    ref = onnxruntime_outputs(onnx_path, {"X": x})
    np.testing.assert_allclose(np.load(tmp_path / "mlp_relu.npy"), ref["mlp/relu"], rtol=1e-4, atol=1e-5)


def test_damaged_packages_give_clean_errors(mlp, tmp_path):
    _, pkg = mlp
    data = pkg.read_bytes()
    manifest_offset = int.from_bytes(data[24:32], "little")
    cases = {f"cut{n}.kiln": data[:n] for n in [0, 4, 7, 63, 64, len(data) // 2, len(data) - 1]}
    cases["cut_unnamed.bin"] = data[:40]  # found by its magic, named anything
    cases["grown.kiln"] = data + b"\0" * 64
    for off, what in [(0, "magic"), (9, "format version"), (20, "file size"), (50, "header checksum"),
                      (manifest_offset + 8, "manifest")]:
        b = bytearray(data)
        b[off] ^= 0x40
        cases[f"flip_{what.replace(' ', '_')}.kiln"] = bytes(b)
    for name, content in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        for cmd in [["run"], ["inspect"], ["bench", "-n", 1, "-w", 0]]:
            assert_clean_error(kiln(*cmd, path, "--device", "cpu"), name)


def test_damaged_weights_and_no_verify_weights(mlp, tmp_path):
    _, pkg = mlp
    b = bytearray(pkg.read_bytes())
    b[64 + 3] ^= 0x40  # the exponent of the first value of the first data section
    bad = tmp_path / "bad_weights.kiln"
    bad.write_bytes(bytes(b))
    assert_clean_error(kiln("run", bad, "--device", "cpu"), bad.name)
    good, _ = run_outputs(pkg, tmp_path / "good", "--seed", 1, "--no-verify-weights")
    same, _ = run_outputs(pkg, tmp_path / "same", "--seed", 1)
    assert_bit_identical(good, same)
    unchecked, _ = run_outputs(bad, tmp_path / "unchecked", "--seed", 1, "--no-verify-weights")
    assert any(good[k].tobytes() != unchecked[k].tobytes() for k in good), "the damaged weight was not used"


def test_help_names_packages():
    for cmd in ["run", "inspect", "bench"]:
        r = kiln(cmd, "--help")
        assert r.returncode == 0 and ".kiln" in r.stdout and "--strict" in r.stdout, r.stdout


def test_convert_refuses_a_package(mlp, tmp_path):
    _, pkg = mlp
    assert_clean_error(kiln("convert", pkg, "-o", tmp_path / "again.kiln"), "already a kiln package",
                       pkg.name)
    assert not (tmp_path / "again.kiln").exists()


def test_convert_warm_up_stores_laid_out_weights(tmp_path):
    """--warm-up runs the package once before writing it: the CPU's laid-out conv weight is stored,
    a load on this CPU takes it, and the outputs stay those of the package without it (and ONNX
    Runtime's)."""
    w = RNG.standard_normal((16, 8, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(16).astype(np.float32)
    nodes = [helper.make_node("Conv", ["X", "W", "B"], ["C"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["C"], ["Y"])]
    g = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", 8, 12, 12])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n", 16, 12, 12])],
                          [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "conv.onnx"))
    x = RNG.standard_normal((2, 8, 12, 12)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    plain = convert(tmp_path / "conv.onnx", tmp_path / "plain.kiln", "X=2,8,12,12")
    r = kiln("convert", tmp_path / "conv.onnx", "-o", tmp_path / "warm.kiln", "--shape", "X=2,8,12,12", "--warm-up",
             "--input", f"X={tmp_path / 'x.npy'}")
    assert r.returncode == 0 and "warm-up: one run" in r.stdout, r.stdout + r.stderr
    infos = {}
    for name in ["plain", "warm"]:
        r = kiln("inspect", tmp_path / f"{name}.kiln", "--json", "--device", "cpu")
        assert r.returncode == 0, r.stderr
        infos[name] = json.loads(r.stdout)["laid_out_weights"]
    assert infos["plain"]["count"] == 0 and infos["plain"]["for"] == "", infos
    assert infos["warm"]["count"] == 1 and infos["warm"]["taken"] == 1 and "onednn" in infos["warm"]["for"], infos
    r = kiln("inspect", tmp_path / "warm.kiln", "--device", "cpu")
    assert "laid-out weights: 1 for onednn" in r.stdout and "taken by this load" in r.stdout, r.stdout
    outs = {n: run_outputs(tmp_path / f"{n}.kiln", tmp_path / f"out_{n}", "-i", f"X={tmp_path / 'x.npy'}")[0]
            for n in ["plain", "warm"]}
    assert_bit_identical(outs["plain"], outs["warm"])
    np.testing.assert_allclose(outs["warm"]["Y.npy"], onnxruntime_outputs(tmp_path / "conv.onnx", {"X": x})["Y"],
                               rtol=1e-4, atol=1e-5)
    # an --input that names no input fails cleanly; a dynamic package skips the run
    assert_clean_error(kiln("convert", tmp_path / "conv.onnx", "-o", tmp_path / "bad.kiln", "--shape",
                            "X=2,8,12,12", "--warm-up", "--input", f"Q={tmp_path / 'x.npy'}"), "Q", "--input")
    r = kiln("convert", tmp_path / "conv.onnx", "-o", tmp_path / "dyn.kiln", "--warm-up")
    assert r.returncode == 0 and "warm-up: skipped" in r.stdout, r.stdout + r.stderr
