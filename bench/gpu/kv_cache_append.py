#!/usr/bin/env python3
"""Appending one token's keys to a KV cache of 4096 positions x 32 heads x 128 (bf16, 32 MiB), in
place, at 512, 2048 and 4095 filled positions: kiln's assign_slice (the position a device tensor
read by the kernel) against PyTorch eager (a slice copy_ and index_copy_) and torch.compile of
the slice copy, in one process. Every append is one call that returns when the GPU is done (a
synchronous kiln run; torch.cuda.synchronize after PyTorch's), so the figures are per-call
latency, launch included; then the same appends submitted without waiting in between (kiln's
run_async, PyTorch without a sync), the GPU drained once at the end. For contrast, kiln's
whole-cache form: assign of a where() over the positions, which moves the 32 MiB every call; and
the append inside a step that reads the whole cache, against the same step without it.
The update moves 8 KiB: at 4.17 TB/s that is 2 ns, so every figure here is launch and call
overhead, and what matters is that it does not grow with the filled length.

    kv_cache_append.py [--calls N] [--device cuda]
"""
import argparse
import time

import numpy as np

POSITIONS, HEADS, DIM = 4096, 32, 128
FILLED = (512, 2048, 4095)


def per_call_us(fn, calls):
    fn()  # first call (compiles, plans) left out
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def pipelined_us(submit, finish, calls):
    """Per-call host time when nothing waits between calls (a decode loop's appends), the GPU
    drained once at the end."""
    finish(submit())
    t0 = time.perf_counter()
    last = None
    for _ in range(calls):
        last = submit()
    finish(last)
    return (time.perf_counter() - t0) / calls * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    import torch

    import kiln

    dev = a.device
    kdev = dev + ":0" if ":" not in dev else dev
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    rng = np.random.default_rng(0)
    init = rng.standard_normal((POSITIONS, HEADS, DIM)).astype(np.float32)
    token = torch.randn(1, HEADS, DIM, device=dev, dtype=torch.bfloat16)

    # kiln: the cache is a variable; the token and the starts are fed as device tensors
    g = kiln.Graph()
    cache = g.variable(kiln.Array(init, kiln.bf16), "k_cache")
    new = g.placeholder([1, HEADS, DIM], kiln.bf16, "new")
    starts = g.placeholder([3], kiln.i64, "starts")
    append = g.compile([], updates=[kiln.assign_slice(cache, new, starts)], device=kdev)
    # the same append as a whole-cache rewrite: where(position == p, token, cache)
    g2 = kiln.Graph()
    cache2 = g2.variable(kiln.Array(init, kiln.bf16), "k_cache")
    new2 = g2.placeholder([1, HEADS, DIM], kiln.bf16, "new")
    pos2 = g2.placeholder([POSITIONS, 1, 1], kiln.bool_, "at")
    rewrite = g2.compile([], updates=[kiln.assign(cache2, kiln.where(pos2, new2, cache2))],
                         device=kdev)

    # the append inside a step: a step that reads the whole cache (its sum), with and without the
    # append first (the step reads the appended cache); the difference is what the append adds
    g3 = kiln.Graph()
    cache3 = g3.variable(kiln.Array(init, kiln.bf16), "k_cache")
    new3 = g3.placeholder([1, HEADS, DIM], kiln.bf16, "new")
    starts3 = g3.placeholder([3], kiln.i64, "starts")
    with_append = g3.compile(
        [kiln.sum(kiln.cast(kiln.assign_slice(cache3, new3, starts3), kiln.f32))], device=kdev)
    without = g3.compile([kiln.sum(kiln.cast(cache3, kiln.f32))], device=kdev)

    tcache = torch.tensor(init, device=dev).to(torch.bfloat16)

    def slice_copy(c, t, p):
        c[p:p + 1].copy_(t)

    compiled = torch.compile(slice_copy, dynamic=True)
    ktoken = kiln.Array.from_dlpack(token)
    rows = {}
    for filled in FILLED:
        kstarts = kiln.Array.from_dlpack(torch.tensor([filled, 0, 0], device=dev))
        mask = torch.zeros(POSITIONS, 1, 1, dtype=torch.bool, device=dev)
        mask[filled] = True
        kmask = kiln.Array.from_dlpack(mask)
        idx = torch.tensor([filled], device=dev)
        r = {}
        r["kiln assign_slice"] = per_call_us(lambda: append.run({new: ktoken, starts: kstarts}),
                                             a.calls)
        r["kiln step + append"] = per_call_us(
            lambda: with_append.run({new3: ktoken, starts3: kstarts}), a.calls)
        r["kiln step alone"] = per_call_us(lambda: without.run({}), a.calls)
        r["kiln whole-cache assign"] = per_call_us(
            lambda: rewrite.run({new2: ktoken, pos2: kmask}), max(a.calls // 10, 20))

        def eager():
            slice_copy(tcache, token, filled)
            sync()

        def index_copy():
            tcache.index_copy_(0, idx, token)
            sync()

        def comp():
            compiled(tcache, token, filled)
            sync()

        queue = kiln.Queue(kdev)
        r["kiln run_async, no wait"] = pipelined_us(
            lambda: append.run_async(queue, {new: ktoken, starts: kstarts}),
            lambda f: f.result(), a.calls)
        r["torch eager, no sync"] = pipelined_us(
            lambda: slice_copy(tcache, token, filled), lambda _: sync(), a.calls)
        r["torch eager slice copy_"] = per_call_us(eager, a.calls)
        r["torch eager index_copy_"] = per_call_us(index_copy, a.calls)
        r["torch.compile slice copy_"] = per_call_us(comp, a.calls)
        rows[filled] = r
    # correctness: the kiln cache holds the token at every appended position, the rest as given
    got = np.asarray(g.read_variable(cache).astype(kiln.f32).numpy())
    want = init.astype(np.float32)
    want = torch.tensor(want).to(torch.bfloat16).float().numpy()
    tok = token.float().cpu().numpy()
    for filled in FILLED:
        want[filled:filled + 1] = tok
    assert np.array_equal(got, want), "kiln's cache differs from the reference"

    peers = [k for k in rows[FILLED[0]] if k.startswith("torch") and "no sync" not in k]
    print(f"append one token (1 x {HEADS} x {DIM} bf16, 8 KiB) to a {POSITIONS} x {HEADS} x {DIM} "
          f"bf16 cache (32 MiB) on {dev}; us per call, {a.calls} calls each")
    names = [n for n in rows[FILLED[0]]
             if "no wait" not in n and "no sync" not in n and "step" not in n]
    print(f"{'filled':>8} " + " ".join(f"{n:>26}" for n in names) + "  kiln/best peer")
    for filled, r in rows.items():
        best = min(r[p] for p in peers)
        print(f"{filled:>8} " + " ".join(f"{r[n]:>26.2f}" for n in names) +
              f"  {r['kiln assign_slice'] / best:.2f}")
    for filled, r in rows.items():
        print(f"{filled:>8} pipelined: kiln {r['kiln run_async, no wait']:.2f} us a call, torch "
              f"eager {r['torch eager, no sync']:.2f}: "
              f"{r['kiln run_async, no wait'] / r['torch eager, no sync']:.2f}")
    for filled, r in rows.items():
        print(f"{filled:>8} in a step that reads the cache: {r['kiln step + append']:.2f} us with "
              f"the append, {r['kiln step alone']:.2f} without: the append adds "
              f"{r['kiln step + append'] - r['kiln step alone']:.2f} us")
    ks = [rows[f]["kiln assign_slice"] for f in FILLED]
    print(f"kiln assign_slice spread over filled lengths: {max(ks) / min(ks):.3f} (max/min)")


if __name__ == "__main__":
    main()
