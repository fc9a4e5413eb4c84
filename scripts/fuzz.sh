#!/usr/bin/env bash
# make fuzz: runs the libFuzzer targets of the sanitizer build, FUZZ_SECONDS each, JOBS at a time
# (each fuzzer is one process on one core). Each starts from its seed corpus in tests/fuzz and
# writes new inputs to SAN_BUILD/<corpus> and crashes to SAN_BUILD/<prefix>crash-*; its output
# goes to SAN_BUILD/fuzz-logs/<target>.log, whose last lines are printed. Fails if any fuzzer
# does, after all have run.
#
#   scripts/fuzz.sh SAN_BUILD FUZZ_SECONDS JOBS
set -uo pipefail
cd "$(dirname "$0")/.."
SAN=${1:?sanitizer build directory}
SECONDS_EACH=${2:-60}
JOBS=${3:-$(nproc)}
LOGS="$SAN/fuzz-logs"
mkdir -p "$LOGS"
# target, seed corpus, corpus directory in the build, artifact prefix
RUNS=(
  "fuzz_onnx_import tests/fuzz/corpus corpus ''"
  "fuzz_package_load tests/fuzz/package_corpus package_corpus package-"
  "fuzz_npy_read tests/fuzz/npy_corpus npy_corpus npy-"
  "fuzz_safetensors_read tests/fuzz/safetensors_corpus safetensors_corpus safetensors-"
  "fuzz_tokenizer tests/fuzz/tokenizer_corpus tokenizer_corpus tokenizer-"
  "fuzz_coreml_import tests/fuzz/coreml_corpus coreml_corpus coreml-"
)
run_one() {
  local target=$1 seeds=$2 corpus=$3 prefix=$4
  [ "$prefix" = "''" ] && prefix=
  mkdir -p "$SAN/$corpus"
  UBSAN_OPTIONS=print_stacktrace=1 "$SAN/tests/fuzz/$target" -max_total_time="$SECONDS_EACH" \
    -max_len=65536 -rss_limit_mb=4096 -artifact_prefix="$SAN/$prefix" "$SAN/$corpus" "$seeds" \
    > "$LOGS/$target.log" 2>&1
}
declare -A PIDS
failed=0
finish() {  # waits for one fuzzer and reports it
  local target=$1 rc=0
  wait "${PIDS[$target]}" || rc=$?
  echo "== $target: $([ $rc = 0 ] && echo ok || echo "FAILED (exit $rc)")"
  tail -n "$([ $rc = 0 ] && echo 2 || echo 60)" "$LOGS/$target.log"
  [ $rc = 0 ] || failed=1
}
order=()
for run in "${RUNS[@]}"; do
  read -r target seeds corpus prefix <<< "$run"
  if [ ${#order[@]} -ge "$JOBS" ]; then
    finish "${order[0]}"
    order=("${order[@]:1}")
  fi
  run_one "$target" "$seeds" "$corpus" "$prefix" &
  PIDS[$target]=$!
  order+=("$target")
done
for target in "${order[@]}"; do finish "$target"; done
exit $failed
