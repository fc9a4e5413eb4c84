"""examples/python/train_digits.py: build -> train -> save -> load -> infer."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_train_digits_example(tmp_path):
    pytest.importorskip("sklearn")
    import kiln

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(pathlib.Path(kiln.__file__).parent.parent), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "python" / "train_digits.py"),
                        "--out", str(tmp_path), "--device", "cpu", "--epochs", "5"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    acc = float(re.search(r"test accuracy ([0-9.]+)", r.stdout).group(1))
    assert acc > 0.9, r.stdout
    assert (tmp_path / "digits.kiln").exists() and (tmp_path / "digits.ckpt").exists()
