#!/usr/bin/env python3
"""Real exported models on the CPU: kiln against ONNX Runtime on the same ONNX files, with the same
number of threads, in one process. Each model is a directory with model.onnx and
test_data_set_0/input_*.pb (the layout of tests/data/onnx_models and of scripts/onnx_models.py's
output, which makes larger models). Per model: the median time of a run after warm-up runs,
kiln's and ONNX Runtime's (in alternating blocks of runs), their ratio, and the largest difference of their outputs; then the
geometric mean of the ratios.

    bench/cpu/onnx_models.py [DIR] [--threads 2] [--reps 100] [--only REGEX]
        [--python-path build/python]

DIR defaults to tests/data/onnx_models.
"""
import argparse
import glob
import math
import os
import re
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def median_ms(fns, reps, block=20):
    """Median ms of each of fns over `reps` runs, taken in blocks of `block` runs of one fn at a
    time, the fns alternating block by block: the machine's slower or faster stretches fall on all
    alike, and one runtime's threads, still spinning after its block, delay only the first run of
    the next (which is left out)."""
    t = [[] for _ in fns]
    for _ in range(max(1, reps // block)):
        for i, f in enumerate(fns):
            f()
            for _ in range(block):
                t0 = time.perf_counter()
                f()
                t[i].append(time.perf_counter() - t0)
    return [float(np.median(x)) * 1e3 for x in t]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", nargs="?", default=os.path.join(HERE, "..", "..", "tests", "data",
                                                           "onnx_models"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--only", default=".*")
    ap.add_argument("--python-path", default=None)
    a = ap.parse_args()
    os.environ["KILN_THREADS"] = str(a.threads)
    if a.python_path:
        sys.path.insert(0, a.python_path)
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    import kiln

    print(f"kiln {kiln.__version__}, onnxruntime {ort.__version__}, {a.threads} threads, "
          f"{os.cpu_count()} CPUs")
    print(f"| model | kiln ms | ONNX Runtime ms | kiln / ORT | max abs diff |")
    print("|---|---|---|---|---|")
    ratios = []
    for case in sorted(glob.glob(os.path.join(a.dir, "*", "model.onnx"))):
        d = os.path.dirname(case)
        name = os.path.basename(d)
        if not re.search(a.only, name):
            continue
        files = sorted(glob.glob(os.path.join(d, "test_data_set_0", "input_*.pb")),
                       key=lambda p: int(re.search(r"(\d+)\.pb$", p).group(1)))
        if not files:
            continue
        so = ort.SessionOptions()
        so.intra_op_num_threads = a.threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(case, so, providers=["CPUExecutionProvider"])
        feeds = {}
        for f, i in zip(files, sess.get_inputs()):
            t = onnx.TensorProto()
            t.ParseFromString(open(f, "rb").read())
            feeds[i.name] = numpy_helper.to_array(t)
        try:
            exe = kiln.onnx.load(case).compile(device="cpu")
        except kiln.Error as e:
            print(f"| {name} | failed: {str(e).splitlines()[0][:80]} | | | |")
            continue
        got = [o.numpy() for o in exe.run(feeds)]
        want = sess.run(None, feeds)
        diff = max(float(np.abs(g.astype(np.float64) - w.astype(np.float64)).max())
                   for g, w in zip(got, want))
        k, o = median_ms([lambda: exe.run(feeds), lambda: sess.run(None, feeds)], a.reps)
        ratios.append(k / o)
        print(f"| {name} | {k:.3f} | {o:.3f} | {k / o:.2f}x | {diff:.1e} |", flush=True)
    if ratios:
        g = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(f"geometric mean of kiln / ONNX Runtime over {len(ratios)} models: {g:.2f}x")


if __name__ == "__main__":
    main()
