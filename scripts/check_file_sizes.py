#!/usr/bin/env python3
"""Source files stay small: no file of the library, CLI or Python bindings over 800 lines.

Walks src/, include/, tools/ and python/src/ (.h .cpp .cu .cuh .inc) and fails, naming each, on a
file over the budget. The files that are over it today are listed in scripts/file_size_budget.txt
with the line count they may not pass (each to be split by concern); a listed file that grows
fails, and one that is back under the budget must leave the list.

    check_file_sizes.py [repo root]
"""
import pathlib
import sys

BUDGET = 800
FOLDERS = ("src", "include", "tools", "python/src")
SUFFIXES = (".h", ".cpp", ".cu", ".cuh", ".inc")


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    allowed = {}
    for line in (root / "scripts/file_size_budget.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            path, limit = line.split()
            allowed[path] = int(limit)
    problems, files = [], 0
    for folder in FOLDERS:
        for f in sorted((root / folder).rglob("*")):
            if f.suffix not in SUFFIXES or not f.is_file():
                continue
            files += 1
            rel = str(f.relative_to(root))
            n = len(f.read_text(errors="replace").splitlines())
            limit = allowed.pop(rel, None)
            if limit is None and n > BUDGET:
                problems.append(f"{rel}: {n} lines, over the budget of {BUDGET}: split it by concern")
            elif limit is not None and n > limit:
                problems.append(f"{rel}: {n} lines, over the {limit} it is held to "
                                "(scripts/file_size_budget.txt): split it, do not grow it")
            elif limit is not None and n <= BUDGET:
                problems.append(f"{rel}: {n} lines, within the budget: remove it from "
                                "scripts/file_size_budget.txt")
    problems += [f"{p}: listed in scripts/file_size_budget.txt but not found" for p in allowed]
    for p in problems:
        print(p)
    print(f"file sizes: {files} files, {len(problems)} problems (budget {BUDGET} lines)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
