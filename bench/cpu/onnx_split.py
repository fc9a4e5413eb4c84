#!/usr/bin/env python3
"""Models that kiln's ONNX session splits (docs/onnx.md): a node whose outputs' sizes depend on
run-time values (NonZero, NonMaxSuppression) or a node of strings runs on the host between compiled
parts. Each run's time, kiln against ONNX Runtime on the same file and feeds, both with the same
number of threads; the data changes every run (new counts), so kiln's host node is imported for
each run's values. Prints the median of the timed runs after warm-up runs, and the ratio.

    bench/cpu/onnx_split.py [--runs 50] [--threads 2] [--device cpu] [--python-path build/python]

Models (random data, written here):
  nonzero   x (4096, 16) -> NonZero(x > 0) -> GatherND(x, nzᵀ) * 2 and a ReduceSum beside it
  nms       2,000 boxes and scores computed from inputs -> NMS (200 kept at most) -> gather them
  strings   10,000 words -> StringSplit -> RegexFullMatch -> counts; LabelEncoder of ids -> concat
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np


def write(path, nodes, inputs, outputs, inits=(), opset=20):
    from onnx import helper

    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                          opset_imports=[helper.make_opsetid("", opset),
                                         helper.make_opsetid("ai.onnx.ml", 3)])
    m.ir_version = 9
    with open(path, "wb") as f:
        f.write(m.SerializeToString())


def models(tmp, rng):
    from onnx import TensorProto as T, helper as h

    F, I64, S = T.FLOAT, T.INT64, T.STRING
    vi = h.make_tensor_value_info
    out = {}
    p = os.path.join(tmp, "nonzero.onnx")
    write(p, [h.make_node("Greater", ["x", "zero"], ["m"]), h.make_node("NonZero", ["m"], ["nz"]),
              h.make_node("Transpose", ["nz"], ["t"]), h.make_node("GatherND", ["x", "t"], ["g"]),
              h.make_node("Mul", ["g", "two"], ["y"]),
              h.make_node("ReduceSum", ["x"], ["s"], keepdims=0)],
          [vi("x", F, ["n", 16])], [vi("y", F, None), vi("s", F, None)],
          [h.make_tensor("zero", F, [], [0.0]), h.make_tensor("two", F, [], [2.0])])
    out["nonzero"] = (p, lambda: {"x": rng.standard_normal((4096, 16)).astype(np.float32)})
    p = os.path.join(tmp, "nms.onnx")
    write(p, [h.make_node("Abs", ["raw"], ["boxes"]), h.make_node("Sigmoid", ["logits"], ["scores"]),
              h.make_node("NonMaxSuppression", ["boxes", "scores", "k", "iou", "smin"], ["sel"]),
              h.make_node("Gather", ["sel", "col"], ["idx"], axis=1),
              h.make_node("Squeeze", ["boxes", "ax"], ["b2"]),
              h.make_node("Gather", ["b2", "idx"], ["picked"], axis=0)],
          [vi("raw", F, [1, "n", 4]), vi("logits", F, [1, 1, "n"])], [vi("picked", F, None)],
          [h.make_tensor("k", I64, [1], [200]), h.make_tensor("iou", F, [1], [0.5]),
           h.make_tensor("smin", F, [1], [0.3]), h.make_tensor("col", I64, [], [2]),
           h.make_tensor("ax", I64, [1], [0])])
    out["nms"] = (p, lambda: {"raw": (rng.random((1, 2000, 4)) * 100).astype(np.float32),
                              "logits": rng.standard_normal((1, 1, 2000)).astype(np.float32)})
    p = os.path.join(tmp, "strings.onnx")
    write(p, [h.make_node("StringSplit", ["lines"], ["parts", "counts"]),
              h.make_node("RegexFullMatch", ["parts"], ["hit"], pattern=r"[a-z]+\.com"),
              h.make_node("Cast", ["hit"], ["h64"], to=I64),
              h.make_node("ReduceSum", ["h64", "ax1"], ["hits"], keepdims=0),
              h.make_node("Add", ["hits", "counts"], ["total"]),
              h.make_node("LabelEncoder", ["ids"], ["names"], domain="ai.onnx.ml",
                          keys_int64s=list(range(100)), values_strings=[f"w{i}" for i in range(100)]),
              h.make_node("StringConcat", ["names", "suffix"], ["named"])],
          [vi("lines", S, ["n"]), vi("ids", I64, ["m"])],
          [vi("total", I64, None), vi("named", S, None)],
          [h.make_tensor("ax1", I64, [1], [1]), h.make_tensor("suffix", S, [], [b".x"])])
    words = np.array(["kiln.com", "graph", "onnx.com", "tensor", "cuda", "a.com"], dtype=object)
    out["strings"] = (p, lambda: {
        "lines": np.array([" ".join(rng.choice(words, size=4)) for _ in range(10000)], dtype=object),
        "ids": rng.integers(0, 120, size=10000).astype(np.int64)})
    return out


def median_ms(fn, feeds, runs, warmup=5):
    for f in feeds[:warmup]:
        fn(f)
    times = []
    for f in feeds[warmup:warmup + runs]:
        t0 = time.perf_counter()
        fn(f)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--python-path", default=None)
    a = ap.parse_args()
    if a.python_path:
        sys.path.insert(0, a.python_path)
    os.environ.setdefault("KILN_THREADS", str(a.threads))
    import kiln
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for name, (path, make) in models(tmp, rng).items():
            feeds = [make() for _ in range(a.runs + 5)]
            s = kiln.onnx.Session(path, device=a.device)
            o = ort.SessionOptions()
            o.intra_op_num_threads = a.threads
            o.inter_op_num_threads = 1
            peer = ort.InferenceSession(path, o, providers=["CPUExecutionProvider"])
            k = median_ms(lambda f: s.run(f), feeds, a.runs)
            r = median_ms(lambda f: peer.run(None, f), feeds, a.runs)
            print(f"kiln onnx_split_{name} {k:.3f} ms  onnxruntime {r:.3f} ms  ratio {k / r:.2f}"
                  f"  (split {s.split}, imports {s.imports})")


if __name__ == "__main__":
    main()
