#!/usr/bin/env python3
"""The demo's loss trajectories on the GPU machine (scripts/test-gpu.sh).

  --cuda LOG --cpu LOG         CUDA against the CPU: the same trajectory until the loss is small
  --same-bits LOG CKPT ...     runs that must agree bit for bit: every epoch's printed loss and
                               the checkpoint's bytes (the CPU at two thread counts; CUDA in
                               deterministic mode, recorded or not, fused or not, in separate
                               processes)
  --converge LOG...            runs outside deterministic mode (CUDA recorded and not): cuDNN's
                               algorithms are timed in each process, so two processes may add in
                               other orders and part after the first epoch, as two machines'
                               CPUs do. Each must train: the first epoch's loss within 1% of the
                               first run's, the last below 0.05

Why CUDA and the CPU part late in training (docs/design/determinism.md, "The demo on CUDA and on the CPU"):
two f32 trainings that add in different orders agree to the printed digit while the loss is
large, and part once it is a few hundredths, where one batch moves it by its own size. The CPU's
own trajectory moves the same way between instruction sets (oneDNN's AVX-512 and AVX2 kernels add
in different orders: KILN_CPU_ISA=avx2 on an AVX-512 machine reads 0.0232 at epoch 12 where the
AVX-512 kernels read 0.0034) and between machines, never with the thread count. So CUDA is held
to the CPU's trajectory in deterministic mode (the same bits in every process), and to bits only
against itself.
"""
import argparse
import filecmp
import re
import sys


def losses(path):
    return [float(m) for m in re.findall(r"epoch +\d+: loss ([0-9.]+)", open(path).read())]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cuda")
    p.add_argument("--cpu")
    p.add_argument("--same-bits", nargs="+", default=[], metavar="LOG CKPT")
    p.add_argument("--converge", nargs="+", default=[], metavar="LOG")
    a = p.parse_args()
    failures = []
    if a.cuda and a.cpu:
        g, c = losses(a.cuda), losses(a.cpu)
        print("cuda", g)
        print("cpu ", c)
        if not g or len(g) != len(c):
            failures.append("cuda and cpu: missing epochs")
        # while the loss is above 0.03: within 0.002 + 1% of the CPU's; then both stay below 0.05
        for i, (x, y) in enumerate(zip(g, c)):
            big = max(x, y) >= 0.03 and not any(max(u, v) < 0.03 for u, v in zip(g[:i], c[:i]))
            if big and abs(x - y) > 0.002 + 0.01 * y:
                failures.append(f"epoch {i + 1}: cuda {x} cpu {y} (before convergence)")
            if not big and max(x, y) >= 0.05:
                failures.append(f"epoch {i + 1}: cuda {x} cpu {y} (after convergence)")
    if a.same_bits:
        if len(a.same_bits) % 2:
            sys.exit("--same-bits takes LOG CKPT pairs")
        pairs = list(zip(a.same_bits[::2], a.same_bits[1::2]))
        first_log, first_ckpt = pairs[0]
        first = losses(first_log)
        if not first:
            failures.append(f"{first_log}: no epochs")
        for log, ckpt in pairs[1:]:
            other = losses(log)
            print(f"{log}: {other}")
            if other != first:
                failures.append(f"{log}: losses {other} differ from {first_log}: {first}")
            if not filecmp.cmp(ckpt, first_ckpt, shallow=False):
                failures.append(f"{ckpt}: the trained weights differ from {first_ckpt}")
        if len(pairs) > 1 and not failures:
            print(f"same bits: {len(pairs)} runs, losses and checkpoints identical")
    if a.converge:
        first = losses(a.converge[0])
        for log in a.converge:
            x = losses(log)
            print(f"{log}: {x}")
            if not x or len(x) != len(first):
                failures.append(f"{log}: {len(x)} epochs, expected {len(first)}")
            elif abs(x[0] - first[0]) > 0.01 * first[0] or x[-1] >= 0.05:
                failures.append(f"{log}: first epoch {x[0]} (first run {first[0]}), last {x[-1]}"
                                " (must be within 1% and below 0.05)")
    for f in failures:
        print("fail:", f)
    if failures:
        return 1
    print("demo done: loss trajectories agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
