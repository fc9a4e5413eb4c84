#!/usr/bin/env bash
# Every line changed since scripts/format_base (a commit) in the C++, CUDA and op-list sources is
# as clang-format (.clang-format) writes it; older lines are left as they are, so the check never
# asks for whitespace churn. Prints the diff that would fix them and fails when there is one.
#
#   check_format.sh [base]     (default: the commit in scripts/format_base)
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-$(cat scripts/format_base)}
if ! git rev-parse -q --verify "$base^{commit}" >/dev/null 2>&1; then
  # a shallow clone (or a tree without git) does not hold the base: nothing to compare with
  echo "format: NOT CHECKED: commit $base is not in this clone (fetch the history to check)"
  exit 0
fi
out=$(git clang-format-14 --diff --extensions cpp,h,cu,cuh "$base" -- src include tools python/src \
      tests bench examples 2>&1 || true)
if [ -z "$out" ] || grep -qE "^(no modified files|clang-format did not modify)" <<<"$out"; then
  echo "format: lines changed since $(git rev-parse --short "$base") are formatted"
  exit 0
fi
echo "$out"
echo "format: FAIL: the lines above are not as clang-format writes them (git clang-format $base fixes them)"
exit 1
