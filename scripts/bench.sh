#!/usr/bin/env bash
# Runs the CPU benchmarks of a build folder (default: build) and prints kiln beside its peers.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
"$BUILD/bench/kiln_bench_cpu" "${@:2}"
"$BUILD/bench/kiln_bench_train" "${@:2}"
