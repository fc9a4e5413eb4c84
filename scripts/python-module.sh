#!/usr/bin/env bash
# Builds kiln's Python extension for another CPython than the build's (e.g. the GPU machine's),
# against a shared-library build: scripts/python-module.sh PYTHON BUILD OUTDIR.
# PYTHON is that interpreter (only its headers and extension suffix are used); the module links
# BUILD/libkiln.so and nanobind's sources from the project's .venv. OUTDIR/kiln gets the package.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$1 BUILD=$2 OUT=$3
inc=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
suffix=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
nb=$(.venv/bin/python -c "import nanobind, os; print(os.path.dirname(nanobind.__file__))")
obj="$BUILD/python-module-$(basename "$PY")"
mkdir -p "$obj" "$OUT/kiln"
flags=(-O2 -DNDEBUG -fPIC -fvisibility=hidden -std=c++20 -ffunction-sections -fdata-sections
       -I"$inc" -I"$nb/include" -I"$nb/ext/robin_map/include" -Iinclude -Isrc)  # src: the op list
srcs=(python/src/*.cpp "$nb"/src/nb_combined.cpp)
pids=()
for s in "${srcs[@]}"; do
  o="$obj/$(basename "$s" .cpp).o"
  extra=()
  [[ "$s" == "$nb"/* ]] && extra=(-DNB_BUILD -DNB_COMPACT_ASSERTIONS -fno-strict-aliasing)
  ccache c++ "${flags[@]}" "${extra[@]}" -c "$s" -o "$o" & pids+=($!)
  if [ ${#pids[@]} -ge "$(nproc)" ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p"; done
c++ -shared -Wl,-s -Wl,--gc-sections -o "$OUT/kiln/_kiln$suffix" "$obj"/*.o -L"$BUILD" -lkiln
cp python/kiln/*.py "$OUT/kiln/"
echo "python-module: $OUT/kiln/_kiln$suffix"
