#!/usr/bin/env bash
# Checks the wheel of scripts/wheel.sh: builds and repairs it, installs it alone into an empty
# directory, and from there imports kiln (not the checkout's or .venv's), runs a graph against
# numpy, and runs the `kiln` console script. `make test` runs it after the Python tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[[ "$PY" == */* ]] && PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"  # (used from another directory)
OUT=build-wheel/dist
rm -rf "$OUT"
WHEEL_DIR=$OUT scripts/wheel.sh >/dev/null
whl=$(ls "$OUT"/kiln-*.whl)
echo "wheel: $(basename "$whl") ($(du -h "$whl" | cut -f1))"
case "$(basename "$whl")" in *manylinux*) ;; *) echo "not a manylinux wheel: $whl"; exit 1 ;; esac
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$PY" -m pip install -q --no-deps --disable-pip-version-check --target "$T" "$whl"
# (numpy and ml_dtypes from the interpreter's own environment: the wheel declares them)
(cd "$T" && PYTHONPATH="$T" "$PY" - "$T" <<'PY'
import sys
import numpy as np
import kiln
assert kiln.__file__.startswith(sys.argv[1]), kiln.__file__
g = kiln.Graph()
x = g.placeholder([3, 4], kiln.f32, "x")
y = kiln.tanh(x) * 2.0 + 1.0
exe = g.compile([y], device="cpu")
xv = np.random.default_rng().standard_normal((3, 4)).astype(np.float32)
got = exe.run({x: kiln.Array(xv)})[0].numpy()
np.testing.assert_allclose(got, np.tanh(xv.astype(np.float64)) * 2 + 1, rtol=1e-5, atol=1e-6)
print("wheel: import kiln and a run against numpy: ok")
PY
)
PYTHONPATH="$T" "$T/bin/kiln" --version
# (the list read whole, then searched: grep -q would exit at the first match and cut the command
# off with a broken pipe)
ops=$(PYTHONPATH="$T" "$T/bin/kiln" ops)
[[ $ops == *matmul* ]]
echo "wheel: the kiln console script runs"
