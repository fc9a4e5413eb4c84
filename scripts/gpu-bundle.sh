#!/usr/bin/env bash
# Builds, on a machine with the CUDA toolkit (no GPU needed), everything `make test-gpu` and the
# GPU benchmarks run on a GPU machine that can neither build nor install: the CUDA build's test
# suites, CLI and benchmarks, stripped, with the non-CUDA shared libraries they need and the demo
# data, packed into BUILD/bundle.tar.xz (small enough to copy over).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_SHARED=ON >/dev/null
# BUNDLE_TARGETS="a b": build only these (the bundle then carries older builds of the rest)
cmake --build "$BUILD" ${BUNDLE_TARGETS:+--target $BUNDLE_TARGETS}
.venv/bin/python scripts/digits.py "$BUILD/data" >/dev/null
stage="$BUILD/bundle"
rm -rf "$stage" && mkdir -p "$stage/lib" "$stage/tests" "$stage/bench"
cp "$BUILD/kiln" "$stage/"
cp "$BUILD"/tests/kiln_*tests "$stage/tests/"
for t in kiln_onnx_conformance kiln_onnx_tests; do [ -x "$BUILD/tests/$t" ] && cp "$BUILD/tests/$t" "$stage/tests/"; done
[ -x "$BUILD/tests/kiln_backend_ops" ] && cp "$BUILD/tests/kiln_backend_ops" "$stage/tests/"
[ -x "$BUILD/tests/kiln_dp_train_nccl" ] && cp "$BUILD/tests/kiln_dp_train_nccl" "$stage/tests/"
for b in "$BUILD"/bench/kiln_bench_*; do [[ -x "$b" && "$b" != *_mpi ]] && cp "$b" "$stage/bench/"; done
[ -x "$BUILD/bench/package/kiln_bench_package" ] && cp "$BUILD/bench/package/kiln_bench_package" "$stage/bench/"
cp "$BUILD"/kiln_example_* "$stage/" 2>/dev/null || true
cp "$BUILD/libkiln.so" "$stage/lib/"
# custom-op libraries and the programs that load them, at their build paths (the tests and the
# hash-grid benchmark name the libraries by path): test-gpu.sh copies them back into BUILD
for f in "$BUILD"/tests/*.so "$BUILD"/examples/custom_op/*.so "$BUILD"/examples/custom_op/kiln_example_* \
         "$BUILD"/bench/custom_op/kiln_bench_*; do
  [ -e "$f" ] && install -D "$f" "$stage/oplibs/$f"
done
# the Python package (built for the venv's Python), for the PyTorch bridge tests there
# (BUNDLE_PYTHON=path/to/python3.X adds a module for that Python, the GPU machine's)
if [ -d "$BUILD/python/kiln" ]; then
  cp -r "$BUILD/python" "$stage/python"
  [ -n "${BUNDLE_PYTHON:-}" ] && scripts/python-module.sh "$BUNDLE_PYTHON" "$BUILD" "$stage/python"
  strip "$stage"/python/kiln/_kiln*.so 2>/dev/null || true
  # the Core ML op tests, which need coremltools (absent there), run here on the CPU and record
  # each model, its feeds and kiln's outputs (python/tests/coreml_util.py) for their replay on
  # CUDA (test_coreml_replay.py; about 400 cases, 1.5 MB of files)
  coreml_tests=()
  for t in python/tests/test_coreml*.py; do
    [[ $t == */test_coreml_replay.py || $t == */test_coreml_models.py ]] || coreml_tests+=("$t")
  done
  if ! KILN_COREML_RECORD="$stage/coreml_cases" PYTHONPATH="$BUILD/python" \
      KILN_BUILD_DIR="$BUILD" .venv/bin/python -m pytest -q -p no:cacheprovider "${coreml_tests[@]}" \
      > "$BUILD/coreml-record.log" 2>&1; then
    tail -n 30 "$BUILD/coreml-record.log"
    echo "gpu-bundle.sh: recording the Core ML op tests failed (log: $BUILD/coreml-record.log)" >&2
    exit 1
  fi
  echo "Core ML cases: $(ls "$stage/coreml_cases" | wc -l)," \
    "$(find "$stage/coreml_cases" -type f -printf '%s\n' | awk '{s += $1} END {printf "%.1f MB", s / 1e6}')"
fi
# every kernel compiled into libkiln, by the names the CUDA runtime registers them under (the
# mangled names among its read-only strings), with the launch counter, for the GPU suite's
# variant coverage (scripts/kernel_coverage.py)
objcopy -O binary --only-section='.rodata*' "$BUILD/libkiln.so" "$stage/rodata.bin"
strings -n 4 "$stage/rodata.bin" | grep '^_Z' | sort -u > "$stage/kernels.txt"
c++filt < "$stage/kernels.txt" | paste "$stage/kernels.txt" - | grep -P '\tvoid ' > "$stage/kernels.tsv"
rm "$stage/rodata.bin" "$stage/kernels.txt"
[ -e "$BUILD/tests/libkiln_kernel_counter.so" ] && cp "$BUILD/tests/libkiln_kernel_counter.so" "$stage/lib/"
strip "$stage"/kiln* "$stage"/tests/* "$stage"/bench/* "$stage/lib/libkiln.so" 2>/dev/null || true
[ -d "$stage/oplibs" ] && find "$stage/oplibs" -type f -exec strip {} + 2>/dev/null || true
cp -r "$BUILD/data" "$stage/data"
# ONNX's node tests (written when the build was configured), for their run on CUDA
[ -d "$BUILD/tests/onnx_node_tests/node" ] && cp -r "$BUILD/tests/onnx_node_tests" "$stage/onnx_node_tests"
# shared libraries from Debian that the GPU machine lacks (CUDA's own come from its Python env)
ldd "$stage/kiln" "$stage"/tests/* | awk '/=> \// {print $3}' | sort -u |
  grep -E 'libdnnl|libfmt|libgomp|libOpenCL|libbenchmark|libgtest|libgmock|libonnx|libprotobuf|libre2' | grep -v "$BUILD" |
  xargs -r -I{} cp -L {} "$stage/lib/"
# NVRTC (fused elementwise kernels) and its builtins, which it opens at run time: only with
# BUNDLE_NVRTC=1 (130 MB; scripts/gpu-env.sh finds the GPU machine's own in its Python env)
for lib in $( [ "${BUNDLE_NVRTC:-0}" = 1 ] && ldd "$stage/kiln" | awk '/libnvrtc/ {print $3}'); do
  cp -L "$lib" "$stage/lib/"
  cp -L "$(dirname "$lib")"/libnvrtc-builtins.so* "$stage/lib/" 2>/dev/null || true
done
tar -C "$BUILD" -cJf "$BUILD/bundle.tar.xz" bundle
ls -la "$BUILD/bundle.tar.xz"
