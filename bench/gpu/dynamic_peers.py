#!/usr/bin/env python3
"""ResNet-50 bf16 inference with a batch that changes from call to call, kiln against PyTorch in one
call: kiln's dynamic executable (bench/gpu/bench_gpu.cpp, resnet50_dynamic_batch_bf16), PyTorch
eager, and torch.compile(dynamic=True) (default mode, compiled once for a symbolic batch; its
compile and recompiles count in its first calls). The batches and their order are kiln's bench's.

    dynamic_peers.py KILN_BENCH_GPU [--reps N]

Per batch: the warm median (CUDA events for PyTorch; kiln's bench times its own runs), the first
call of that batch (wall clock, synchronized), and the ratio of kiln's warm figure to the best
PyTorch one. Then a sweep: the first call of each batch plus 50 warm calls each, summed.
"""
import argparse
import re
import statistics
import subprocess
import time

BATCHES = (1, 8, 32, 64, 16, 24, 48, 4, 2, 12)
SWEEP_WARM = 50


def kiln_figures(binary, reps):
    out = subprocess.run([binary, "--only", "resnet50_dynamic_batch_bf16", "--reps", str(reps)],
                         capture_output=True, text=True, check=True).stdout
    print(out.rstrip())
    line = re.compile(r"batch\s+(\d+): first call ([\d.]+) ms.*warm ([\d.]+) ms")
    return {int(m[1]): (float(m[3]), float(m[2])) for m in line.finditer(out)}


def torch_figures(torch, run, reps):
    """batch -> (warm median ms, first call ms) for `run(x)` over BATCHES in order."""
    r = {}
    for b in BATCHES:
        x = torch.randn(b, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last,
                                                              dtype=torch.bfloat16)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run(x)
        torch.cuda.synchronize()
        first = (time.perf_counter() - t0) * 1e3
        for _ in range(3):
            run(x)
        times = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            run(x)
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        r[b] = (statistics.median(times), first)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kiln_bench")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    import torch
    import torchvision

    torch.backends.cudnn.benchmark = True
    kiln = kiln_figures(a.kiln_bench, a.reps)
    model = torchvision.models.resnet50().cuda().eval().to(memory_format=torch.channels_last,
                                                             dtype=torch.bfloat16)
    with torch.inference_mode():
        eager = torch_figures(torch, model, a.reps)
        compiled = torch.compile(model, dynamic=True)
        dyn = torch_figures(torch, compiled, a.reps)
    print("| batch | kiln dynamic | eager | torch.compile(dynamic=True) | kiln / best | "
          "first call: kiln | eager | compile(dynamic) |")
    print("|---|---|---|---|---|---|---|---|")
    totals = {"kiln": 0.0, "eager": 0.0, "compile": 0.0}
    for b in BATCHES:
        k, e, c = kiln[b], eager[b], dyn[b]
        best = min(e[0], c[0])
        print(f"| {b} | {k[0]:.3f} ms | {e[0]:.3f} ms | {c[0]:.3f} ms | {k[0] / best:.2f} | "
              f"{k[1]:.0f} ms | {e[1]:.0f} ms | {c[1]:.0f} ms |")
        for name, f in (("kiln", k), ("eager", e), ("compile", c)):
            totals[name] += f[1] + SWEEP_WARM * f[0]
    best = min(totals["eager"], totals["compile"])
    print(f"sweep (first call + {SWEEP_WARM} warm calls per batch): kiln {totals['kiln'] / 1e3:.2f} s, "
          f"eager {totals['eager'] / 1e3:.2f} s, torch.compile(dynamic=True) "
          f"{totals['compile'] / 1e3:.2f} s; kiln / best {totals['kiln'] / best:.2f}")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")


if __name__ == "__main__":
    main()
