"""The Core ML op tests replayed on another device: KILN_COREML_CASES names a directory of cases
that python/tests/coreml_util.py recorded (KILN_COREML_RECORD) while the tests ran on the CPU,
each a model, its feeds and the CPU's outputs; every case is imported, compiled for
KILN_COREML_REPLAY_DEVICE (default: cuda when there is a device, else cpu), run on the feeds and
compared with the CPU's outputs at the test's tolerances (integer and bool outputs exactly).
`make test-gpu` replays the cases scripts/gpu-bundle.sh recorded on CUDA, where coremltools is
not installed. Without KILN_COREML_CASES the replay skips, and the round trip below records a
few programs itself and replays them on the CPU."""
import json
import os
import pathlib

import numpy as np
import pytest
from conftest import cuda_available

import kiln

CASES = os.environ.get("KILN_COREML_CASES")


def find_cases(root):
    """The case directories under `root` (those with a case.json), sorted by name."""
    return sorted(p.parent for p in pathlib.Path(root).glob("*/case.json"))


def replay(case, device):
    """Runs one recorded case on `device` and compares its outputs with the recorded ones."""
    case = pathlib.Path(case)
    meta = json.loads((case / "case.json").read_text())
    where = f"{meta['id']} (run {meta['index']}, {case.name})"
    m = kiln.coreml.load(str(case / meta["model"]), **meta["load_args"])
    with np.load(case / "feeds.npz") as f:
        feeds = {n: f[f"in{i}"] for i, n in enumerate(meta["inputs"])}
    with np.load(case / "outputs.npz") as f:
        want = [f[f"out{i}"] for i in range(len(f.files))]
    got = [o.numpy() for o in m.compile(device=device).run(feeds)]
    assert len(got) == len(want), f"{where}: {len(got)} outputs, recorded {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        what = f"{where}: output {k} ({meta['outputs'][k]}) on {device}"
        assert g.shape == w.shape and g.dtype == w.dtype, \
            f"{what} is {g.dtype}{g.shape}, recorded {w.dtype}{w.shape}"
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w, err_msg=what)
        else:
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64),
                                       rtol=meta["rtol"], atol=meta["atol"], err_msg=what)


def replay_device():
    return os.environ.get("KILN_COREML_REPLAY_DEVICE") or ("cuda" if cuda_available() else "cpu")


def _params():
    if not CASES:
        return [pytest.param(None, id="unset", marks=pytest.mark.skip(
            reason="KILN_COREML_CASES is not set (a directory of cases recorded with "
                   "KILN_COREML_RECORD; scripts/gpu-bundle.sh records them for make test-gpu)"))]
    cases = find_cases(CASES)
    if not cases:
        return [pytest.param(None, id="no-cases")]
    return [pytest.param(c, id=c.name) for c in cases]


@pytest.mark.parametrize("case", _params())
def test_replay(case):
    if case is None:
        pytest.fail(f"KILN_COREML_CASES={CASES} holds no recorded case (no */case.json)")
    replay(case, replay_device())


def test_record_and_replay_round_trip(tmp_path, monkeypatch, rng):
    """coreml_util records what run() and check() ran on the CPU (not runs that failed, nor any
    without KILN_COREML_RECORD), and a replay passes, and fails once an output is changed."""
    pytest.importorskip("coremltools")
    import coreml_util as cu

    mb = cu.mb
    root = tmp_path / "cases"
    monkeypatch.setenv("KILN_COREML_RECORD", str(root))
    x, y = cu.randn(rng, 2, 3), cu.randn(rng, 2, 3)

    @cu.program(((2, 3), np.float32), ((2, 3), np.float32))
    def f32(x, y):
        return mb.mul(x=mb.add(x=x, y=y), y=x)

    @cu.program(((4,), np.int32))
    def i32(a):
        return mb.mul(x=a, y=np.int32(3))

    @cu.program(((2, 3), np.float16))
    def f16(x):
        return mb.cast(x=mb.sigmoid(x=x), dtype="fp32")

    cu.check(tmp_path, f32, {"x": x, "y": y}, [(x.astype(np.float64) + y) * x], rtol=1e-3)
    a = rng.integers(-100, 100, 4).astype(np.int32)
    (got,) = cu.run(cu.save(i32, tmp_path / "i.mlpackage"), {"a": a})
    np.testing.assert_array_equal(got, 3 * a)
    half = cu.run(cu.save(f16, tmp_path / "h.mlpackage"), {"x": x.astype(np.float16)})
    with pytest.raises(kiln.ShapeError):  # not recorded
        cu.run(tmp_path / "i.mlpackage", {"a": a[:3]})
    monkeypatch.delenv("KILN_COREML_RECORD")
    cu.run(tmp_path / "i.mlpackage", {"a": a})  # not recorded

    cases = find_cases(root)
    metas = [json.loads((c / "case.json").read_text()) for c in cases]
    assert [m["index"] for m in metas] == [0, 1, 2]
    assert all(m["id"].endswith("::test_record_and_replay_round_trip") for m in metas)
    assert [(m["rtol"], m["atol"], m["fp16"]) for m in metas] == [
        (1e-3, 1e-5, False), (1e-4, 1e-5, False), (2e-2, 2e-2, True)]
    with np.load(cases[2] / "outputs.npz") as f:
        np.testing.assert_array_equal(f["out0"], half[0])
    for c in cases:
        replay(c, "cpu")

    def tamper(case, change):
        with np.load(case / "outputs.npz") as f:
            outs = dict(f)
        outs["out0"] = change(outs["out0"])
        np.savez(case / "outputs.npz", **outs)
        with pytest.raises(AssertionError):
            replay(case, "cpu")

    tamper(cases[0], lambda o: o * (1 + 2e-3))  # past rtol 1e-3
    tamper(cases[1], lambda o: o + np.int32(1))  # integers compare exactly
    tamper(cases[2], lambda o: o[:1])  # another shape
    assert find_cases(tmp_path / "none") == []
