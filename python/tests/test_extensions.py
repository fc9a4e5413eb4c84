"""The profiler and custom op libraries from Python."""
import json

import numpy as np
import pytest

import kiln


def test_profiler_records_every_op_and_exports_a_trace(tmp_path):
    g = kiln.Graph()
    x = g.placeholder([4, 8], kiln.f32, "x")
    y = kiln.softmax(kiln.matmul(x, kiln.transpose(x)))  # ops no fusion merges
    exe = g.compile([y], device="cpu")
    xv = np.random.default_rng().standard_normal((4, 8)).astype(np.float32)
    assert not kiln.Profiler.active()
    kiln.Profiler.start()
    assert kiln.Profiler.active()
    for _ in range(3):
        (out,) = exe.run({x: xv})
    prof = kiln.Profiler.stop()
    assert not kiln.Profiler.active()
    s = xv.astype(np.float64) @ xv.T.astype(np.float64)
    want = np.exp(s - s.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)
    ops = prof.ops()
    for name in ("matmul", "softmax"):
        assert ops.count(name) == 3, (name, ops)
    assert isinstance(prof, kiln.Profile) and len(prof) >= len(ops)
    trace = json.loads(prof.chrome_trace())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    spans = [e for e in events if e.get("ph") == "X"]
    assert spans and all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    assert "softmax" in prof.summary()
    prof.save(str(tmp_path / "t.json"))
    prof.save(str(tmp_path / "t.html"))
    assert json.loads((tmp_path / "t.json").read_text())
    html = (tmp_path / "t.html").read_text()
    assert html.lstrip().lower().startswith("<!doctype html") and "softmax" in html


def test_profiler_start_twice_and_stop_when_off_are_errors():
    kiln.Profiler.start()
    with pytest.raises(kiln.Error):
        kiln.Profiler.start()
    kiln.Profiler.stop()
    with pytest.raises(kiln.Error):
        kiln.Profiler.stop()


def test_load_op_library_names_a_missing_file(tmp_path):
    missing = str(tmp_path / "libnot_there.so")
    with pytest.raises(kiln.Error) as e:
        kiln.load_op_library(missing)
    assert "libnot_there.so" in str(e.value)
    assert isinstance(kiln.custom_op_names(), list)


def test_the_package_under_test_is_the_installed_one_when_asked():
    # `make test` runs this suite against `pip install .` (KILN_TEST_INSTALLED=1)
    import os

    if not os.environ.get("KILN_TEST_INSTALLED"):
        pytest.skip("testing the build tree's package")
    assert "site-packages" in kiln.__file__ and "build" not in kiln.__file__.split("site-packages")[1]


def _test_ops_library():
    import os
    import pathlib

    lib = pathlib.Path(os.environ.get("KILN_BUILD_DIR", "build")) / "tests" / "libkiln_test_ops.so"
    if not lib.exists():
        pytest.skip(f"{lib} is not built")
    kiln.load_op_library(str(lib))  # loading the same file again does nothing
    return lib


def test_custom_ops_from_a_loaded_library_run_and_differentiate(rng):
    _test_ops_library()
    assert {"test.softshrink", "test.mix"} <= set(kiln.custom_op_names())
    g = kiln.Graph()
    x = g.placeholder([6, 7], kiln.f32, "x")
    z = g.placeholder([6, 7], kiln.f32, "z")
    (y,) = kiln.custom_op("test.softshrink", [x], {"lambda": 0.25})
    y0, y1 = kiln.custom_op("test.mix", [x, z], {"a": 2.0, "b": -1.0, "power": 3})
    (dx,) = kiln.gradients(kiln.sum(y), [x])
    exe = g.compile([y, y0, y1, dx], device="cpu")
    xv = rng.standard_normal((6, 7)).astype(np.float32)
    zv = rng.standard_normal((6, 7)).astype(np.float32)
    got = [o.numpy() for o in exe.run({x: xv, z: zv})]
    x64, z64 = xv.astype(np.float64), zv.astype(np.float64)
    want_y = np.where(x64 > 0.25, x64 - 0.25, np.where(x64 < -0.25, x64 + 0.25, 0.0))
    np.testing.assert_allclose(got[0], want_y, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got[1], 2 * x64 - z64, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[2], x64 ** 3 * z64, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[3], (np.abs(x64) > 0.25).astype(np.float32))
    with pytest.raises(kiln.Error) as e:
        kiln.custom_op("test.softshrink", [x], {"no_such_attr": 1})
    assert "no_such_attr" in str(e.value)


SOFTSHRINK_SOURCE = r"""
// pyext.softshrink(x; lambda): built by kiln.extensions.load in a test
#include "kiln/custom_op.h"
#include "kiln/kiln.h"

namespace {
void cpu(kiln::KernelContext& ctx, kiln::Stream&) {
  const float* x = ctx.in(0).ptr<float>();
  float* y = ctx.out(0).ptr<float>();
  const float l = static_cast<float>(ctx.attrs().f("lambda"));
  for (int64_t i = 0; i < ctx.in(0).numel(); ++i)
    y[i] = x[i] > l ? x[i] - l : x[i] < -l ? x[i] + l : 0.f;
}
}  // namespace

KILN_OP_LIBRARY(r) {
  kiln::CustomOpDef d;
  d.name = "pyext.softshrink@TAG@";
  d.inputs = {{"x", {kiln::f32}}};
  d.outputs = {{"y", kiln::f32, 0}};
  d.attrs = {{"lambda", 0.5}};
  r.register_op(d);
  r.register_kernel("pyext.softshrink@TAG@", kiln::Backend::cpu, cpu);
}
"""


def _cxx_or_skip():
    import shutil

    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler")


def test_extensions_build_load_run_and_cache(rng, tmp_path):
    """kiln.extensions.load compiles an op library from a C++ source, loads it, and the op runs
    against numpy; the same sources again come from the cache; other sources build anew."""
    import os

    _cxx_or_skip()
    tag = os.urandom(4).hex()  # an op name of its own: op names are process-wide
    src = tmp_path / "softshrink.cpp"
    src.write_text(SOFTSHRINK_SOURCE.replace("@TAG@", tag))
    build = tmp_path / "build"
    lib = kiln.extensions.load("pyext_softshrink", [str(src)], build_directory=build)
    assert os.path.isfile(lib) and f"pyext.softshrink{tag}" in kiln.custom_op_names()
    mtime = os.path.getmtime(lib)
    assert kiln.extensions.load("pyext_softshrink", [src], build_directory=build) == lib
    assert os.path.getmtime(lib) == mtime  # not rebuilt
    g = kiln.Graph()
    x = g.placeholder([5, 9], kiln.f32, "x")
    (y,) = kiln.custom_op(f"pyext.softshrink{tag}", [x], {"lambda": 0.3})
    xv = rng.standard_normal((5, 9)).astype(np.float32)
    got = g.compile([y], device="cpu").run({x: xv})[0].numpy()
    x64 = xv.astype(np.float64)
    want = np.where(x64 > 0.3, x64 - 0.3, np.where(x64 < -0.3, x64 + 0.3, 0.0))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    src.write_text(SOFTSHRINK_SOURCE.replace("@TAG@", tag + "b"))
    assert kiln.extensions.load("pyext_softshrink", [src], build_directory=build) != lib


def test_extensions_report_compiler_errors_and_bad_arguments(tmp_path):
    _cxx_or_skip()
    bad = tmp_path / "bad.cpp"
    bad.write_text("#include \"kiln/custom_op.h\"\nthis is not C++;\n")
    with pytest.raises(kiln.extensions.BuildError) as e:
        kiln.extensions.load("pyext_bad", [bad], build_directory=tmp_path / "build")
    assert "building 'pyext_bad' failed" in str(e.value) and "bad.cpp" in str(e.value)
    assert isinstance(e.value, kiln.Error)
    assert not list((tmp_path / "build").glob("*.so"))  # nothing half-built left
    with pytest.raises(FileNotFoundError):
        kiln.extensions.load("pyext_missing", [tmp_path / "nope.cpp"], build_directory=tmp_path)
    with pytest.raises(ValueError):
        kiln.extensions.load("bad name!", [bad], build_directory=tmp_path)
