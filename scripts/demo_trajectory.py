#!/usr/bin/env python3
"""The demo's loss trajectories on CUDA against the CPU's, and CUDA's own variants.

    demo_trajectory.py cuda.log cpu.log cuda-nocapture.log cuda-nofusion.log
"""
import re
import sys


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
