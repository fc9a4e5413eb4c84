"""Makes the package in the build tree importable (PYTHONPATH=build/python does the same), unless
KILN_TEST_INSTALLED=1 asks for the installed one (`pip install .`, as `make test` does)."""
import os
import pathlib
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
_build = pathlib.Path(os.environ.get("KILN_BUILD_DIR", ROOT / "build"))
if (not os.environ.get("KILN_TEST_INSTALLED") and (_build / "python" / "kiln").is_dir()
        and str(_build / "python") not in sys.path):
    sys.path.insert(0, str(_build / "python"))


@pytest.fixture
def rng():
    return np.random.default_rng()


def cuda_available():
    import kiln

    return kiln.cuda_device_count() > 0
