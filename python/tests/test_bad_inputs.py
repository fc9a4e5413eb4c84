"""Bad paths, bad files and bad feeds through the Python API raise kiln's exceptions, and objects
used after the graph, model or executable they came from is gone keep working or raise: never a
crash. Each case that could crash runs in a child process, so that a crash fails the case (with
its signal) instead of ending the test run."""
import gc
import os
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kiln

PYTHONPATH = os.pathsep.join(p for p in sys.path if p)


def in_child(code, timeout=120):
    """Runs `code` (after `import kiln, numpy as np`) in a fresh interpreter; returns its output.
    Fails on a signal, a sanitizer report or a non-zero exit."""
    src = "import gc, sys\nimport numpy as np\nimport kiln\n" + textwrap.dedent(code)
    env = dict(os.environ, PYTHONPATH=PYTHONPATH, KILN_DEVICE="cpu")
    r = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, f"status {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    assert "Sanitizer" not in r.stderr, r.stderr[-4000:]
    return r.stdout


def small_graph():
    g = kiln.Graph()
    x = g.placeholder([2, 4], kiln.f32, "x")
    w = g.constant(np.arange(12, dtype=np.float32).reshape(4, 3) / 10, "w")
    y = kiln.relu(kiln.matmul(x, w))
    return g, x, y


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    g, x, y = small_graph()
    pkg = d / "m.kiln"
    g.compile([y], device="cpu").save(str(pkg))
    good = pkg.read_bytes()
    out = {"dir": d / "adir", "missing": d / "nope" / "m.kiln", "pkg": pkg}
    out["dir"].mkdir()
    for name, data in {"empty.kiln": b"", "trunc.kiln": good[: len(good) // 2], "header.kiln": good[:64],
                       "magic.kiln": b"KILNPKX\0" + good[8:], "random.onnx": os.urandom(3000),
                       "empty.onnx": b"", "text.onnx": b"not a model", "empty.npy": b""}.items():
        (d / name).write_bytes(data)
        out[name] = d / name

    def npy(name, descr, shape, data=b""):
        h = ("{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)).encode()
        h += b" " * ((-(10 + len(h) + 1)) % 64) + b"\n"
        (d / name).write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h + data)
        out[name] = d / name

    npy("huge.npy", "<f4", "(999999999999999, 999999999999999)")
    npy("zero_huge.npy", "<f8", "(0, 999999999999999, 999999999999999, 999999999999999)")
    npy("negative.npy", "<f4", "(-1, 4)", b"\0" * 16)
    npy("complex.npy", "<c8", "(2,)", b"\0" * 16)
    npy("big_endian.npy", ">f4", "(2,)", b"\0" * 8)
    npy("short.npy", "<f4", "(2, 4)", b"\0" * 5)
    np.save(d / "ok.npy", np.ones((2, 4), np.float32))
    out["ok.npy"] = d / "ok.npy"
    return out


@pytest.mark.parametrize("name", ["missing", "dir", "empty.kiln", "trunc.kiln", "header.kiln", "magic.kiln",
                                  "random.onnx", "text.onnx"])
def test_bad_package_paths_raise(files, name):
    with pytest.raises((kiln.IoError, kiln.FormatError)):
        kiln.Executable.load(str(files[name]), device="cpu")


@pytest.mark.parametrize("data", [b"", b"KILNPKG\0", b"\0" * 64, b"KILNPKG\0" + b"\xff" * 200])
def test_bad_package_bytes_raise(data):
    with pytest.raises(kiln.FormatError):
        kiln.Executable.load_bytes(data, device="cpu")


@pytest.mark.parametrize("name", ["missing", "dir", "empty.onnx", "random.onnx", "text.onnx", "trunc.kiln"])
def test_bad_onnx_paths_raise(files, name):
    with pytest.raises((kiln.IoError, kiln.FormatError)):
        kiln.onnx.load(str(files[name]))


@pytest.mark.parametrize("data", [b"", b"\x08", os.urandom(100), b"\x0a\xff\xff\xff\xff\x0f"])
def test_bad_onnx_bytes_raise(data):
    with pytest.raises(kiln.FormatError):
        kiln.onnx.load_bytes(data)


@pytest.mark.parametrize("name", ["missing", "dir", "empty.npy", "huge.npy", "zero_huge.npy", "negative.npy",
                                  "complex.npy", "big_endian.npy", "short.npy", "pkg"])
def test_bad_npy_files_raise(files, name):
    with pytest.raises((kiln.IoError, kiln.FormatError)):
        kiln.Array.load_npy(str(files[name]))


def test_good_npy_still_reads(files):
    np.testing.assert_array_equal(kiln.Array.load_npy(str(files["ok.npy"])).numpy(), np.ones((2, 4)))


def test_bad_feeds_raise():
    g, x, y = small_graph()
    exe = g.compile([y], device="cpu")
    ok = np.ones((2, 4), np.float32)
    for bad, err in [(np.ones((2, 4), np.float64), kiln.DTypeError), (np.ones((2, 4), np.int64), kiln.DTypeError),
                     (np.ones((3, 4), np.float32), kiln.ShapeError), (np.ones(8, np.float32), kiln.ShapeError),
                     (np.float32(1), kiln.ShapeError), (np.ones((0, 4), np.float32), kiln.ShapeError)]:
        with pytest.raises(err):
            exe.run({x: bad})
        with pytest.raises(err):
            exe.run({"x": bad})
    with pytest.raises(kiln.ValueError):
        exe.run({"nope": ok})
    with pytest.raises(kiln.ValueError):
        exe.run({})
    with pytest.raises((TypeError, kiln.Error)):
        exe.run({x: np.array(["a", "b"])})
    with pytest.raises((TypeError, kiln.Error)):
        exe.run({x: np.ones((2, 4), np.complex64)})
    with pytest.raises((TypeError, kiln.Error)):
        exe.run({x: object()})
    with pytest.raises((TypeError, kiln.Error)):
        exe.run([ok])
    with pytest.raises((TypeError, kiln.Error)):
        exe.run({3: ok})
    # a non-contiguous or big-endian view is copied or refused, never misread
    wide = np.ones((2, 8), np.float32)
    try:
        got = exe.run({x: wide[:, ::2]})[0].numpy()
        np.testing.assert_allclose(got, np.maximum(wide[:, ::2] @ (np.arange(12).reshape(4, 3) / 10), 0), rtol=1e-6)
    except (TypeError, kiln.Error):
        pass
    be = np.arange(8, dtype=">f4").reshape(2, 4)
    np.testing.assert_allclose(exe.run({x: be})[0].numpy(), exe.run({x: be.astype(np.float32)})[0].numpy())
    np.testing.assert_array_equal(kiln.Array(be).numpy(), be)
    np.testing.assert_allclose(exe.run({x: ok})[0].numpy(), np.maximum(ok @ (np.arange(12).reshape(4, 3) / 10), 0),
                               rtol=1e-6)


def test_bad_compile_arguments_raise():
    g, x, y = small_graph()
    other = kiln.Graph()
    z = other.placeholder([2, 4], kiln.f32, "z")
    with pytest.raises((TypeError, kiln.Error)):
        g.compile([y], feed_shapes=[(x, (2, 4))], device="cpu")
    with pytest.raises((TypeError, kiln.Error)):
        g.compile([y], feed_shapes={"x": (2, 4)}, device="cpu")
    with pytest.raises(kiln.Error):
        g.compile([z], device="cpu")
    with pytest.raises(kiln.Error):
        g.compile([y], feed_shapes={z: (2, 4)}, device="cpu")
    with pytest.raises((kiln.Error, TypeError)):
        g.compile([y], device="tpu:3")
    with pytest.raises((kiln.Error, TypeError, ValueError)):
        g.compile([y], feed_shapes={x: (2, -7)}, device="cpu")


def test_tensors_of_two_graphs_do_not_mix():
    out = in_child("""
        g1, g2 = kiln.Graph(), kiln.Graph()
        a = g1.placeholder([2], kiln.f32, "a")
        b = g2.placeholder([2], kiln.f32, "b")
        for f in (lambda: a + b, lambda: kiln.matmul(a, b), lambda: kiln.concat([a, b], 0),
                  lambda: g1.read_variable(b), lambda: g1.write_variable(b, np.ones(2, np.float32)),
                lambda: g1.compile([b], device="cpu"), lambda: g1.compile([a], feed_shapes={b: (2,)}, device="cpu")):
            try:
                f()
                print("accepted")
            except kiln.Error as e:
                print(type(e).__name__)
    """)
    assert out.split() == ["ValueError"] * 7, out


def test_tensor_outlives_its_graph():
    out = in_child("""
        def make():
            g = kiln.Graph()
            x = g.placeholder([2, 3], kiln.f32, "x")
            return x, kiln.exp(x) * 2
        x, y = make()
        gc.collect()
        assert y.shape == (2, 3) and y.dtype == kiln.f32
        z = kiln.relu(y) + x  # building on a graph only its tensors hold
        gc.collect()
        print(z.shape)
    """)
    assert "(2, 3)" in out


def test_executable_outlives_its_graph_and_model(files):
    out = in_child(f"""
        def make():
            g = kiln.Graph()
            x = g.placeholder([2, 4], kiln.f32, "x")
            w = g.variable(np.ones((4, 3), np.float32), "w")
            return g.compile([kiln.matmul(x, w)], device="cpu")
        exe = make()
        gc.collect()
        y = exe.run({{"x": np.ones((2, 4), np.float32)}})[0].numpy()
        assert (y == 4).all(), y
        exe.write_variable("w", np.full((4, 3), 2, np.float32))
        assert (exe.run({{"x": np.ones((2, 4), np.float32)}})[0].numpy() == 8).all()
        # a loaded package whose file is gone
        import os, shutil
        path = {str(files["pkg"])!r} + ".copy.kiln"
        shutil.copy({str(files["pkg"])!r}, path)
        loaded = kiln.Executable.load(path, device="cpu")
        with open(path, "r+b") as f:
            f.truncate(10)
        os.remove(path)
        a = loaded.run({{"x": np.ones((2, 4), np.float32)}})[0].numpy()
        b = loaded.run({{"x": np.ones((2, 4), np.float32)}})[0].numpy()
        assert (a == b).all()
        print("ok")
    """)
    assert "ok" in out


def test_results_outlive_everything():
    out = in_child("""
        def run():
            g = kiln.Graph()
            x = g.placeholder([3], kiln.f32, "x")
            exe = g.compile([kiln.exp(x)], device="cpu")
            q = kiln.Queue()
            fut = exe.run_async(q, {"x": np.zeros(3, np.float32)})
            return fut, exe.run({"x": np.zeros(3, np.float32)})[0]
        fut, arr = run()
        gc.collect()
        print(fut.result()[0].numpy().tolist(), arr.numpy().tolist())
    """)
    assert "[1.0, 1.0, 1.0] [1.0, 1.0, 1.0]" in out


def test_onnx_model_tensors_outlive_the_model(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["X"], ["Y"])], "r",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path = tmp_path / "r.onnx"
    onnx.save(m, str(path))
    out = in_child(f"""
        def parts():
            model = kiln.onnx.load({str(path)!r})
            return model.output_tensors(), model.compile(device="cpu")
        outs, exe = parts()
        gc.collect()
        print(outs[0].shape, exe.run({{"X": np.array([-1, 2], np.float32)}})[0].numpy().tolist())
    """)
    assert "(2,) [0.0, 2.0]" in out


def test_empty_objects_raise_or_work():
    out = in_child("""
        for name, f in [("Array", lambda: kiln.Array().numpy()), ("Array.shape", lambda: kiln.Array().shape),
                        ("Array.to", lambda: kiln.Array().to("cpu")),
                        ("Graph.compile", lambda: kiln.Graph().compile([], device="cpu")),
                        ("Graph.dump", lambda: kiln.Graph().dump())]:
            try:
                f()
                print(name, "ok")
            except (kiln.Error, TypeError, ValueError) as e:
                print(name, type(e).__name__)
        print("done")
    """)
    assert "done" in out


@pytest.mark.parametrize("make", [lambda: kiln.Array.empty([2**40, 2**40]), lambda: kiln.Array.zeros([2**31, 2**31, 4]),
                                  lambda: kiln.Graph().placeholder([2**40, 2**40]),
                                  lambda: kiln.ones(kiln.Graph(), [2**33, 2**31], kiln.f32)])
def test_shapes_past_any_memory_raise(make):
    # their element counts overflow 64 bits: refused before anything counts or allocates them
    with pytest.raises(kiln.ShapeError, match="2\\^59"):
        make()


def test_large_but_countable_shapes_still_build():
    g = kiln.Graph()
    x = g.placeholder([2**20, 2**20], kiln.f32, "x")
    assert kiln.relu(x).shape == (2**20, 2**20)
    assert kiln.Array.zeros([0, 2**40]).shape == (0, 2**40)


def test_tensor_indices_out_of_range_raise():
    g = kiln.Graph()
    x = g.placeholder([3, 4], kiln.f32, "x")
    for key in (3, -4, 2**63 - 1, -(2**63), (0, 4), (0, -5)):
        with pytest.raises(IndexError):
            x[key]
    assert x[2].shape == (4,) and x[-3, -1].shape == ()
