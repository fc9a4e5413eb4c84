#!/usr/bin/env bash
# Runs on the GPU machine (`make test-gpu`), from the bundle scripts/gpu-bundle.sh made: the C++
# suites with KILN_DEVICE=cuda, the CUDA runtime tests (also under KILN_VALIDATE=cpu), the
# cross-backend harness, compute-sanitizer memcheck over the harness, ONNX models on CUDA, and the
# demo on CUDA; the harness, the models and the demo also with recorded runs off (KILN_CAPTURE=0)
# and with elementwise fusion off (KILN_FUSION=0).
# Logs go to LOGS (default: BUILD/gpu-logs); a summary table is printed last.
# STEPS (an extended regex, default: all) picks the steps to run by name, e.g. STEPS=memcheck.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
LOGS=${2:-$BUILD/gpu-logs}
B="$BUILD/bundle"
[ -d "$B" ] || tar -C "$BUILD" -xJf "$BUILD/bundle.tar.xz"
# custom-op libraries back at the build paths the tests were built with
[ -d "$B/oplibs/$BUILD" ] && cp -r "$B/oplibs/$BUILD/." "$BUILD/"
source scripts/gpu-env.sh
export LD_LIBRARY_PATH="$PWD/$B/lib:$LD_LIBRARY_PATH"
export KILN_DIGITS_DIR="$PWD/$B/data" KILN_TEST_DATA_DIR="$PWD/tests/data"
mkdir -p "$LOGS"
summary=()
step() {  # name, command...
  local name=$1; shift
  [[ "$name" =~ ${STEPS:-.} ]] || return 0
  local t0=$SECONDS
  if timeout 900 "$@" >"$LOGS/$name.log" 2>&1; then r=pass; else r="FAIL($?)"; fi
  local tail_line
  tail_line=$(grep -E '^\[  PASSED  \]|^\[  FAILED  \]|tests? ran|ERROR SUMMARY|backend_ops:|demo done|^pass: |^fail: | passed| failed' "$LOGS/$name.log" | tr '\n' ' ' | cut -c1-150)
  summary+=("$(printf '%-28s %-9s %4ss  %s' "$name" "$r" $((SECONDS - t0)) "$tail_line")")
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$LOGS/gpu.txt" 2>&1
for s in core op autodiff quant; do
  step "suite-$s-on-cuda" env KILN_DEVICE=cuda "$B/tests/kiln_${s}_tests" --gtest_brief=1
done
step cuda-runtime "$B/tests/kiln_cuda_tests" --gtest_brief=1
# queues and events on cuda:0, and the shared-events example
step async-on-cuda "$B/tests/kiln_core_tests" --gtest_brief=1 \
  --gtest_filter='Devices/Async.*:Event.*:QueueTest.*'
[ -x "$B/kiln_example_shared_events" ] &&
  step example-shared-events "$B/kiln_example_shared_events" --device cuda:0 --batches 2000
# the profiler on the GPU: every op timed, a CPU fallback's copies and idle gap
[ -x "$B/tests/kiln_profiler_tests" ] && step profiler-on-cuda "$B/tests/kiln_profiler_tests" --gtest_brief=1
# custom ops: CUDA kernels from a loaded op library, CPU fallback, packages; the examples on CUDA
[ -x "$B/tests/kiln_custom_op_tests" ] && step custom-ops-on-cuda "$B/tests/kiln_custom_op_tests" --gtest_brief=1
[ -x "$BUILD/bench/custom_op/kiln_bench_hashgrid" ] &&
  step hashgrid-bench-cuda "$BUILD/bench/custom_op/kiln_bench_hashgrid" --device cuda
# the GPU idle gaps of a softshrink forced onto the CPU, and none with the softshrink custom op
[ -x "$BUILD/bench/custom_op/kiln_bench_softshrink_profile" ] &&
  step softshrink-profile-cuda "$BUILD/bench/custom_op/kiln_bench_softshrink_profile" --device cuda
step cuda-validate env KILN_VALIDATE=cpu "$B/tests/kiln_cuda_tests" --gtest_brief=1 --gtest_filter='CudaRuntime.*'
if [ -x "$B/tests/kiln_backend_ops" ]; then
  step backend-ops "$B/tests/kiln_backend_ops"
  # the same without recorded runs (every GPU case runs twice; the second replays by default)
  step backend-ops-nocapture env KILN_CAPTURE=0 "$B/tests/kiln_backend_ops"
  step backend-ops-nofusion env KILN_FUSION=0 "$B/tests/kiln_backend_ops"
  # (the recurrent cases on their own: their persistent kernels take minutes under memcheck, so
  # STEPS can give each half a device call of its own)
  RNN_CASES='*/Lstm*:*/Gru*:*/Rnn*'
  step memcheck-backend-ops compute-sanitizer --tool memcheck --error-exitcode 3 \
    "$B/tests/kiln_backend_ops" --gtest_filter="-$RNN_CASES"
  step memcheck-backend-ops-rnn compute-sanitizer --tool memcheck --error-exitcode 3 \
    "$B/tests/kiln_backend_ops" --gtest_filter="$RNN_CASES"
fi
# ONNX models (tests/data/onnx_models, and MODELS_DIR when given) against ONNX Runtime, on CUDA
if [ -x "$B/tests/kiln_onnx_conformance" ]; then
  step onnx-models-cuda "$B/tests/kiln_onnx_conformance" --data tests/data/onnx_models \
    --rtol 1e-4 --atol 1e-5 --device cuda -v
  # the same models with elementwise fusion off, and with runs never recorded as CUDA graphs
  step onnx-models-cuda-nofusion env KILN_FUSION=0 "$B/tests/kiln_onnx_conformance" \
    --data tests/data/onnx_models --rtol 1e-4 --atol 1e-5 --device cuda
  step onnx-models-cuda-nocapture env KILN_CAPTURE=0 "$B/tests/kiln_onnx_conformance" \
    --data tests/data/onnx_models --rtol 1e-4 --atol 1e-5 --device cuda
  [ -n "${MODELS_DIR:-}" ] && step onnx-more-models-cuda "$B/tests/kiln_onnx_conformance" \
    --data "$MODELS_DIR" --rtol 1e-4 --atol 1e-5 --device cuda -v
fi
# the Python package on the GPU: DLPack with PyTorch CUDA tensors, the torch.compile backend
# (only with a module for this machine's Python: gpu-bundle.sh builds one with BUNDLE_PYTHON)
ext=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))' 2>/dev/null)
if [ -d "$B/python/kiln" ] && ! ls "$B/python/kiln/_kiln$ext" >/dev/null 2>&1; then
  [[ python-torch =~ ${STEPS:-.} ]] && summary+=("$(printf '%-28s %-9s %4ss  %s' python-torch \
    skipped 0 "no _kiln$ext in the bundle (BUNDLE_PYTHON=python3.X for scripts/gpu-bundle.sh)")")
elif [ -d "$B/python/kiln" ]; then
  step python-torch env PYTHONPATH="$B/python" KILN_BUILD_DIR=/none python3 -m pytest -q -rs \
    -p no:cacheprovider python/tests/test_torch.py python/tests/test_array.py \
    python/tests/test_runtime.py
fi
step demo-cuda "$B/kiln" demo --device cuda --data "$B/data" --checkpoint "$LOGS/demo.ckpt"
step demo-cpu "$B/kiln" demo --device cpu --data "$B/data" --checkpoint "$LOGS/demo-cpu.ckpt"
# runs not recorded as CUDA graphs must give the same epochs (the demo's runs are recorded by default)
step demo-cuda-nocapture env KILN_CAPTURE=0 "$B/kiln" demo --device cuda --data "$B/data" \
  --checkpoint "$LOGS/demo-nocapture.ckpt"
# and without elementwise fusion
step demo-cuda-nofusion env KILN_FUSION=0 "$B/kiln" demo --device cuda --data "$B/data" \
  --checkpoint "$LOGS/demo-nofusion.ckpt"
# the CUDA demo's loss trajectory must follow the CPU's
step demo-trajectory python3 - "$LOGS/demo-cuda.log" "$LOGS/demo-cpu.log" "$LOGS/demo-cuda-nocapture.log" "$LOGS/demo-cuda-nofusion.log" <<'PY'
import re, sys
def losses(p):
    return [float(m) for m in re.findall(r"epoch +\d+: loss ([0-9.]+)", open(p).read())]
# Two f32 trainings that add in other orders part once the loss is near 0 (a few thousandths,
# where one batch moves it by its own size): the epochs are compared until both losses are below
# 0.05, and from there on both must stay below it (converged).
def differ(a_run, b_run):
    bad, converged = [], False
    for i, (a, b) in enumerate(zip(a_run, b_run)):
        converged = converged or max(a, b) < 0.05
        if (max(a, b) >= 0.05) if converged else (abs(a - b) > 0.02 + 0.1 * b):
            bad.append((i, a, b))
    return bad
g, c = losses(sys.argv[1]), losses(sys.argv[2])
print("cuda", g); print("cpu ", c)
assert g and len(g) == len(c), "missing epochs"
bad = differ(g, c)
assert not bad, f"epochs differ: {bad}"
n = losses(sys.argv[3])
print("cuda, not recorded", n)
# (the same kernels either way; only cuDNN's non-deterministic algorithms may move a digit)
assert len(n) == len(g) and all(abs(a - b) <= 1e-3 + 1e-3 * b for a, b in zip(n, g)), \
    "the runs replayed as CUDA graphs and the ones launched op by op differ"
f = losses(sys.argv[4])
print("cuda, no fusion", f)
# (fused kernels round every instruction as the unfused ones do, but the two executables may time
# cuDNN's backward-filter algorithms differently and pick another order of adding: the last bits
# of a weight gradient move, and over 12 epochs the losses part as far as CUDA's and the CPU's;
# tests/cuda/test_fused_elementwise.cpp checks one step's gradients bit for bit)
bad = differ(f, g)
assert len(f) == len(g) and not bad, f"the runs with and without elementwise fusion differ: {bad}"
print("demo done: loss trajectories agree")
PY
# distributed training over NCCL: one rank per GPU of this machine (and one rank alone), every
# collective against references, and the digits convnet against one process with the whole batch
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || echo 1)
DP="$B/tests/kiln_dp_train_nccl"
step dist-nccl-selftest "$B/kiln" launch -n "$NGPU" -- "$DP" --transport nccl --selftest
step dist-single-cuda "$DP" --data "$B/data" --transport none --device cuda:0 --out "$LOGS/dp-single.txt"
step dist-nccl-1 "$B/kiln" launch -n 1 -- "$DP" --data "$B/data" --transport nccl --out "$LOGS/dp-nccl-1.txt"
step dist-nccl-all "$B/kiln" launch -n "$NGPU" -- "$DP" --data "$B/data" --transport nccl --out "$LOGS/dp-nccl-all.txt"
step dist-trajectory python3 - "$LOGS/dp-single.txt" "$LOGS/dp-nccl-1.txt" "$LOGS/dp-nccl-all.txt" <<'PY'
import sys
runs = [[float(l) for l in open(p)] for p in sys.argv[1:]]
one = runs[0]
for path, r in zip(sys.argv[2:], runs[1:]):
    assert len(r) == len(one), f"{path}: {len(r)} steps, expected {len(one)}"
    worst = max(abs(a - b) / (1e-5 + abs(b)) for a, b in zip(r, one))
    print(f"{path}: worst relative loss difference {worst:.2e}")
    assert worst < 1e-3, f"{path} does not follow the single process"
print("pass: data-parallel losses follow the single process")
PY
echo "GPU: $(cat "$LOGS/gpu.txt")"
printf '%s\n' "${summary[@]}"
! printf '%s\n' "${summary[@]}" | grep -q FAIL
