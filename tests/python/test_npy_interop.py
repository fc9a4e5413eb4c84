"""kiln's .npy reader and writer against numpy's own (tests/io/test_npy_interop.cpp)."""
import os
import pathlib
import subprocess

import numpy as np

BUILD = pathlib.Path(os.environ.get("KILN_BUILD_DIR", "build"))


def test_numpy_files_round_trip_through_kiln(tmp_path):
    rng = np.random.default_rng()
    arrays = {
        "f32": rng.standard_normal((3, 4)).astype(np.float32),
        "f64": rng.standard_normal((5,)),
        "f16": rng.standard_normal((2, 3, 2)).astype(np.float16),
        "i8": rng.integers(-128, 127, (7,), dtype=np.int8),
        "u8": rng.integers(0, 255, (4, 4), dtype=np.uint8),
        "i16": rng.integers(-1000, 1000, (6,), dtype=np.int16),
        "i32": rng.integers(-(2**30), 2**30, (3, 3), dtype=np.int32),
        "i64": rng.integers(-(2**40), 2**40, (2, 2), dtype=np.int64),
        "bool": rng.integers(0, 2, (9,)).astype(np.bool_),
        "scalar": np.array(rng.standard_normal(), dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }
    for name, a in arrays.items():
        np.save(tmp_path / f"{name}.in.npy", a)
    # a format 2.0 file, as numpy writes for very large headers
    v2 = rng.standard_normal((2, 5)).astype(np.float32)
    with open(tmp_path / "v2.in.npy", "wb") as f:
        np.lib.format.write_array(f, v2, version=(2, 0))
    arrays["v2"] = v2

    result = subprocess.run(
        [str(BUILD / "tests" / "kiln_core_tests"), "--gtest_filter=NpyInterop.*"],
        env=dict(os.environ, KILN_NPY_DIR=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for name, a in arrays.items():
        same = np.load(tmp_path / f"{name}.same.npy")
        assert same.dtype == a.dtype and same.shape == a.shape, name
        assert np.array_equal(same, a), name
        twice = np.load(tmp_path / f"{name}.twice.npy")
        assert twice.dtype == np.float64 and twice.shape == a.shape, name
        np.testing.assert_array_equal(twice, a.astype(np.float64) * 2, err_msg=name)
