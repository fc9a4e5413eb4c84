#!/usr/bin/env python3
"""Which of kiln's GPU kernel variants the GPU suite launched.

kernels.tsv (scripts/gpu-bundle.sh) lists every kernel compiled into libkiln, one template
instance a line ("mangled<TAB>demangled"); the counts directories hold the launch counts that
tests/gpu_tools/kernel_counter.cpp wrote for each process of the suite. Prints a table per
kernel family (the kernel's name without its template arguments): its variants, how many were
launched and how often, then every variant never launched. Exits 1 when one was never launched.

    kernel_coverage.py kernels.tsv counts-dir [counts-dir...]
"""
import collections
import os
import re
import sys


def family_and_variant(demangled):
    # "void kiln::cuda::(anonymous namespace)::name<T, U>(args)" -> ("name", "<T, U>")
    s = demangled
    if s.startswith("void "):
        s = s[5:]
    s = s.replace("(anonymous namespace)::", "")
    depth, end = 0, len(s)
    for i, ch in enumerate(s):  # the parameter list starts at the first '(' outside <...>
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            end = i
            break
    name = s[:end]
    t = name.find("<")
    base, targs = (name[:t], name[t:]) if t >= 0 else (name, "")
    base = base.split("::")[-1]
    return base, targs or "(one variant)"


# Kernels compiled in that no dispatcher launches by design: CUB's EmptyKernel only serves
# cudaFuncGetAttributes to read the PTX version CUB was built for.
NEVER_LAUNCHED_BY_DESIGN = {"EmptyKernel"}


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    kernels = {}
    for line in open(sys.argv[1]):
        line = line.rstrip("\n")
        if not line:
            continue
        mangled, _, demangled = line.partition("\t")
        if family_and_variant(demangled or mangled)[0] in NEVER_LAUNCHED_BY_DESIGN:
            continue
        kernels[mangled] = demangled or mangled
    by_demangled = {d: m for m, d in kernels.items()}
    launches = collections.Counter()
    files = 0
    for d in sys.argv[2:]:
        if not os.path.isdir(d):
            continue
        for f in os.listdir(d):
            if not f.endswith(".tsv"):
                continue
            files += 1
            for line in open(os.path.join(d, f)):
                n, _, sym = line.rstrip("\n").partition("\t")
                sym = by_demangled.get(sym, sym)
                launches[sym] += int(n)
    families = collections.defaultdict(list)
    for m, d in kernels.items():
        fam, var = family_and_variant(d)
        families[fam].append((var, launches.get(m, 0)))
    print(f"{'kernel family':40} {'variants':>8} {'reached':>8} {'launches':>10}")
    unreached = []
    for fam in sorted(families):
        vs = families[fam]
        reached = sum(1 for _, n in vs if n)
        print(f"{fam[:40]:40} {len(vs):8} {reached:8} {sum(n for _, n in vs):10}")
        unreached += [f"{fam}{v}" for v, n in sorted(vs) if not n]
    others = sum(n for s, n in launches.items() if s not in kernels)
    total = len(kernels)
    print(f"(plus {others} launches of library and generated kernels; {files} processes counted)")
    for u in unreached:
        print(f"never launched: {u}")
    print(f"kernel coverage: {total - len(unreached)} of {total} kiln kernel variants launched "
          f"({len(families)} families)")
    return 1 if unreached or not files else 0


if __name__ == "__main__":
    sys.exit(main())
