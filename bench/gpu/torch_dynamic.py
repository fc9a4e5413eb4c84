#!/usr/bin/env python3
"""torch.compile(dynamic=True) through kiln's backend against Inductor and eager PyTorch, in one
call on the GPU machine: transformers' BertModel (bert-base-uncased's configuration, random
weights, bf16, SDPA, padding mask) on bert_dynamic.py's sweep of 50 calls whose batch (1-32) and
sequence (16-512) change from call to call. Every call is timed, compiles included (the total is
what a server taking these requests would spend), then the same sweep again, compiled. kiln's
backend compiles each partition once for every size (kiln.torch.report() is printed).

    torch_dynamic.py [--calls N] [--device cuda|cpu]
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from run import bert_base  # noqa: E402  (bert-base-uncased, random weights)
from sweep_shapes import sweep_shapes  # noqa: E402


def sweep(torch, model, shapes, dev):
    """Total ms of the sweep, the ms of its first call, and the last output (for the check)."""
    total, first, out = 0.0, None, None
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    with torch.inference_mode():
        for b, s in shapes:
            ids = (torch.arange(b * s, device=dev).reshape(b, s) * 7919) % 30522
            mask = torch.ones(b, s, dtype=torch.int64, device=dev)
            mask[:, s - s // 4:] = 0  # a padded quarter
            sync()
            t0 = time.perf_counter()
            out = model(input_ids=ids, attention_mask=mask).last_hidden_state
            sync()
            ms = (time.perf_counter() - t0) * 1e3
            total += ms
            first = ms if first is None else first
    return total, first, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    import torch

    import kiln.torch as kt

    shapes = sweep_shapes(a.calls)
    dev = a.device
    model = bert_base(torch, "sdpa").to(dev, torch.bfloat16 if dev == "cuda" else torch.float32).eval()
    results = {}
    eager, eager_first, ref = sweep(torch, model, shapes, dev)
    results["eager"] = (eager, None, eager)
    print(f"eager: sweep {eager / 1e3:.2f} s (first call {eager_first:.1f} ms)", flush=True)
    for name, backend in (("torch.compile(dynamic=True)", "inductor"), ("kiln backend", kt.backend)):
        torch._dynamo.reset()
        kt.reset()
        fast = torch.compile(model, backend=backend, dynamic=True)
        total, first, out = sweep(torch, fast, shapes, dev)
        again, _, _ = sweep(torch, fast, shapes, dev)
        err = (out.float() - ref.float()).abs().max().item()
        results[name] = (total, first, again)
        print(f"{name}: sweep {total / 1e3:.2f} s (first call {first / 1e3:.2f} s), the same sweep "
              f"again {again / 1e3:.3f} s; max |difference| from eager at the last shape {err:.3g}",
              flush=True)
        if backend is kt.backend:
            rep = kt.report()
            print(f"  kiln: {rep['kiln_compiles']} compiles ({rep['dynamic_compiles']} for every "
                  f"size), ops left to PyTorch {rep['fallback_ops']}, dynamic fallbacks "
                  f"{rep['dynamic_fallbacks']}, failed partitions {rep['failed_partitions']}")
    kiln_total, _, kiln_again = results["kiln backend"]
    best = min(v[0] for k, v in results.items() if k != "kiln backend")
    best_again = min(v[2] for k, v in results.items() if k != "kiln backend")
    print(f"sweep of {len(shapes)} calls ({len(set(shapes))} shapes), compiles included: kiln "
          f"backend / best peer {kiln_total / best:.2f}; the sweep again, compiled: kiln backend / "
          f"best peer {kiln_again / best_again:.2f}")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name() if dev == 'cuda' else 'CPU'}")


if __name__ == "__main__":
    main()
