#!/usr/bin/env python3
"""BERT-base bf16 on a sweep of 50 calls whose batch (1-32) and sequence (16-512) change from call
to call, kiln against PyTorch in one call on the GPU machine: kiln imports an ONNX export with
batch and sequence as dim_params (one dynamic executable, bf16 autocast; kiln_bench_gpu's
bert_base_dynamic_sweep), PyTorch runs transformers' BertModel in bf16 with SDPA eagerly and
through torch.compile(dynamic=True). Every call is timed, compiles included: the total is what a
server taking these requests would spend.

    bert_dynamic.py KILN_BENCH_GPU [--onnx-dir DIR]
"""
import argparse
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from sweep_shapes import sweep_shapes as shared_sweep  # noqa: E402
from run import bert_base, export_bert_base  # noqa: E402  (bert-base-uncased, random weights)

CALLS = 50


def sweep_shapes(calls=CALLS):
    """The LCG of bench_gpu.cpp's bert_sweep_shapes: the same (batch, seq) sequence."""
    return shared_sweep(calls)


def torch_sweep(torch, model, shapes):
    """Total ms of the sweep, and the ms of the first call (which compiles, for torch.compile)."""
    total, first = 0.0, None
    with torch.inference_mode():
        for b, s in shapes:
            ids = (torch.arange(b * s, device="cuda").reshape(b, s) * 7919) % 30522
            mask = torch.ones(b, s, dtype=torch.int64, device="cuda")
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(input_ids=ids, attention_mask=mask)
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) * 1e3
            total += ms
            first = ms if first is None else first
    return total, first


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kiln_bench")
    ap.add_argument("--onnx-dir", default="/tmp/kiln-bench-onnx")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    import torch

    export_bert_base(a.onnx_dir, dynamic=True)
    r = subprocess.run([a.kiln_bench, "--only", "bert_base_dynamic_sweep", "--onnx-dir", a.onnx_dir,
                        "--reps", str(a.reps)], capture_output=True, text=True)
    print(r.stdout.rstrip(), r.stderr.rstrip()[-3000:], sep="\n", flush=True)
    m = re.search(r"kiln bert_base_dynamic_sweep ([\d.]+)", r.stdout)
    kiln_ms = float(m[1]) if m else float("nan")
    shapes = sweep_shapes()
    model = bert_base(torch, "sdpa").to("cuda", torch.bfloat16).eval()
    eager, _ = torch_sweep(torch, model, shapes)
    torch._dynamo.reset()
    compiled, first = torch_sweep(torch, torch.compile(model, dynamic=True), shapes)
    warm_compiled, _ = torch_sweep(torch, torch.compile(model, dynamic=True), shapes)
    best = min(eager, compiled)
    print(f"sweep of {len(shapes)} calls ({len(set(shapes))} shapes), every call timed: kiln "
          f"{kiln_ms / 1e3:.2f} s, eager {eager / 1e3:.2f} s, torch.compile(dynamic=True) "
          f"{compiled / 1e3:.2f} s (its first call {first / 1e3:.1f} s; the same sweep again, "
          f"compiled: {warm_compiled / 1e3:.2f} s); kiln / best {kiln_ms / best:.2f}, "
          f"kiln / eager {kiln_ms / eager:.2f}")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")


if __name__ == "__main__":
    main()
