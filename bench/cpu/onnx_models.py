#!/usr/bin/env python3
"""Real exported models on the CPU: kiln against ONNX Runtime and OpenVINO on the same ONNX files,
with the same number of threads, in one process. Each model is a directory with model.onnx and
test_data_set_0/input_*.pb (the layout of tests/data/onnx_models and of scripts/onnx_models.py's
output, which makes larger models). Per model: the median time of a run after warm-up runs of
each runtime (in alternating blocks of runs), kiln's ratio to each peer, the largest difference of
kiln's outputs from ONNX Runtime's, and the time to get a runnable model (kiln: import and
compile; ONNX Runtime: session creation; OpenVINO: read and compile); then the geometric means
of the ratios. OpenVINO is optional (`pip install openvino`); without it its columns are empty.

    bench/cpu/onnx_models.py [DIR ...] [--threads 2] [--reps 100] [--only REGEX]
        [--python-path build/python] [--int8]

DIR (one or more) defaults to tests/data/onnx_models. --int8 runs, instead of the models, their
copies quantized by ONNX Runtime's quantize_dynamic (int8 weights, DynamicQuantizeLinear and
MatMulInteger around each product; what users of ORT's quantization run), named NAME_int8, for
the models that have MatMul nodes.
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


def median_ms(fns, reps, block=20, warm=10):
    """Median ms of each of fns over `reps` runs, taken in blocks of `block` runs of one fn at a
    time, the fns alternating block by block: the machine's slower or faster stretches fall on all
    alike. Each block starts with `warm` runs left out: a runtime's threads keep spinning for a
    while after its last run, and where the process has no more cores than threads they take the
    next runtime's cores for many runs, not one (with one run left out, kiln read 0.122 ms a run
    of ViT tiny beside the others and 0.086 alone; ONNX Runtime 0.103 ms of tiny Llama, 0.082
    with ten)."""
    t = [[] for _ in fns]
    for _ in range(max(1, reps // block)):
        for i, f in enumerate(fns):
            for _ in range(warm):
                f()
            for _ in range(block):
                t0 = time.perf_counter()
                f()
                t[i].append(time.perf_counter() - t0)
    return [float(np.median(x)) * 1e3 for x in t]


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def openvino_runner(case, threads):
    """(run(feeds) -> outputs, seconds to read and compile), or None without OpenVINO."""
    try:
        import openvino as ov
    except ImportError:
        return None
    t0 = time.perf_counter()
    core = ov.Core()
    model = core.read_model(case)
    compiled = core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": threads,
                                                 "INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()
    seconds = time.perf_counter() - t0

    def run(feeds):
        request.infer(feeds)
        return [request.get_output_tensor(i).data for i in range(len(compiled.outputs))]

    return run, seconds


def int8_copies(cases, only):
    """ONNX Runtime's quantize_dynamic of each case with MatMul nodes, in a temporary directory
    beside its test data: the paths of the copies' model.onnx."""
    import shutil
    import tempfile

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = tempfile.mkdtemp(prefix="kiln_int8_")
    out = []
    for case in cases:
        name = os.path.basename(os.path.dirname(case))
        if not re.search(only, name + "_int8"):
            continue
        graph = onnx.load(case, load_external_data=False).graph
        if not any(n.op_type == "MatMul" for n in graph.node):
            continue
        d = os.path.join(root, name + "_int8")
        shutil.copytree(os.path.join(os.path.dirname(case), "test_data_set_0"),
                        os.path.join(d, "test_data_set_0"))
        # (products only: ORT's quantizer turns the dynamo exporter's Attention into a QAttention
        # that ORT itself rejects)
        quantize_dynamic(case, os.path.join(d, "model.onnx"), weight_type=QuantType.QInt8,
                         op_types_to_quantize=["MatMul", "Gemm"])
        out.append(os.path.join(d, "model.onnx"))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="*",
                    default=[os.path.join(HERE, "..", "..", "tests", "data", "onnx_models")])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--only", default=".*")
    ap.add_argument("--python-path", default=None)
    ap.add_argument("--int8", action="store_true",
                    help="the models' ONNX Runtime quantize_dynamic copies (those with MatMul)")
    a = ap.parse_args()
    os.environ["KILN_THREADS"] = str(a.threads)
    if a.python_path:
        sys.path.insert(0, a.python_path)
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    import kiln

    try:
        import openvino
        ov_version = openvino.__version__.split("-")[0]
    except ImportError:
        ov_version = "absent"
    print(f"kiln {kiln.__version__}, onnxruntime {ort.__version__}, openvino {ov_version}, "
          f"{a.threads} threads, {os.cpu_count()} CPUs")
    print("| model | kiln ms | ORT ms | OpenVINO ms | kiln / ORT | kiln / OpenVINO | kiln / best "
          "| kiln compile s | ORT session s | OpenVINO compile s | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    r_ort, r_ov, r_best = [], [], []
    cases = sorted(c for d in a.dirs for c in glob.glob(os.path.join(d, "*", "model.onnx")))
    if a.int8:
        cases = int8_copies(cases, a.only)
    for case in cases:
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
        t0 = time.perf_counter()
        sess = ort.InferenceSession(case, so, providers=["CPUExecutionProvider"])
        ort_s = time.perf_counter() - t0
        feeds = {}
        for f, i in zip(files, sess.get_inputs()):
            t = onnx.TensorProto()
            t.ParseFromString(open(f, "rb").read())
            feeds[i.name] = numpy_helper.to_array(t)
        try:
            t0 = time.perf_counter()
            exe = kiln.onnx.load(case).compile(device="cpu")
            kiln_s = time.perf_counter() - t0
        except kiln.Error as e:
            print(f"| {name} | failed: {str(e).splitlines()[0][:80]} | | | | | | | | | |")
            continue
        got = [o.numpy() for o in exe.run(feeds)]
        want = sess.run(None, feeds)
        diff = max(float(np.abs(g.astype(np.float64) - w.astype(np.float64)).max())
                   for g, w in zip(got, want))
        fns = [lambda: exe.run(feeds), lambda: sess.run(None, feeds)]
        ov = None
        try:
            ov = openvino_runner(case, a.threads)
        except Exception as e:  # a model OpenVINO cannot read: its columns say so
            print(f"# {name}: OpenVINO failed: {str(e).splitlines()[0][:100]}")
        if ov:
            fns.append(lambda: ov[0](feeds))
        times = median_ms(fns, a.reps)
        k, o = times[0], times[1]
        v = times[2] if ov else None
        best = min(o, v) if v else o
        r_ort.append(k / o)
        r_best.append(k / best)
        if v:
            r_ov.append(k / v)
        vs = f"{v:.3f}" if v else "-"
        rv = f"{k / v:.2f}x" if v else "-"
        cv = f"{ov[1]:.2f}" if ov else "-"
        print(f"| {name} | {k:.3f} | {o:.3f} | {vs} | {k / o:.2f}x | {rv} | {k / best:.2f}x "
              f"| {kiln_s:.2f} | {ort_s:.2f} | {cv} | {diff:.1e} |", flush=True)
    if r_ort:
        print(f"geometric mean of kiln / ONNX Runtime over {len(r_ort)} models: "
              f"{geomean(r_ort):.2f}x")
    if r_ov:
        print(f"geometric mean of kiln / OpenVINO over {len(r_ov)} models: {geomean(r_ov):.2f}x")
    if r_best:
        print(f"geometric mean of kiln / the faster peer over {len(r_best)} models: "
              f"{geomean(r_best):.2f}x")


if __name__ == "__main__":
    main()
