"""Distributed benchmarks on the GPU machine: kiln beside PyTorch in one call.

usage: python3 bench/dist/run.py BUNDLE [--what allreduce,resnet50] [--max-bytes N]

BUNDLE is the unpacked GPU bundle (scripts/gpu-bundle.sh: BUILD/bundle). Uses every GPU of the
machine (one rank each, started by `kiln launch`):
  allreduce  kiln's NCCL all-reduce (kiln_bench_dist) beside torch.distributed.all_reduce over NCCL,
             f32 sum, 1 MB to 1 GB: bus bandwidth as nccl-tests reports it, and the ratio
  resnet50   kiln's data-parallel ResNet-50 step (batch 32 per GPU, bf16 autocast) on 1 GPU and on
             all of them: images/s and the scaling
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time


def kiln_lines(bundle, n, args):
    cmd = [f"{bundle}/kiln", "launch", "-n", str(n), "--", f"{bundle}/bench/kiln_bench_dist"] + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    sys.stdout.write("".join(l + "\n" for l in p.stdout.splitlines() if l.startswith("#")))
    if p.returncode != 0:
        print(f"kiln failed ({p.returncode}): {p.stderr[-2000:]}")
    return [l.split() for l in p.stdout.splitlines() if l.startswith("kiln ")]


def torch_allreduce(rank, n, sizes, init_file, out):
    import torch
    import torch.distributed as td
    torch.cuda.set_device(rank)
    td.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=n)
    rows = []
    for nbytes in sizes:
        t = torch.zeros(nbytes // 4, device="cuda")
        iters = 10 if nbytes >= (256 << 20) else 30
        for _ in range(3):
            td.all_reduce(t)
        torch.cuda.synchronize()
        td.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            td.all_reduce(t)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3 / iters
        rows.append((nbytes, ms))
    if rank == 0:
        with open(out, "w") as f:
            for nbytes, ms in rows:
                f.write(f"{nbytes} {ms}\n")
    td.destroy_process_group()


def bus(nbytes, ms, n):
    algbw = nbytes / (ms * 1e-3) / 1e9
    return algbw * 2 * (n - 1) / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--what", default="allreduce,resnet50")
    ap.add_argument("--max-bytes", type=int, default=1 << 30)
    a = ap.parse_args()
    import torch
    n = torch.cuda.device_count()
    print(f"# {n} x {torch.cuda.get_device_name(0)}; torch {torch.__version__}, NCCL "
          f"{'.'.join(map(str, torch.cuda.nccl.version()))}")
    whats = a.what.split(",")
    if "allreduce" in whats:
        rows = kiln_lines(a.bundle, n, ["allreduce", "--max-bytes", str(a.max_bytes)])
        kiln = {int(r[3]): float(r[4]) for r in rows if r[1] == "allreduce"}
        sizes = sorted(kiln)
        tmp = tempfile.mkdtemp()
        out = os.path.join(tmp, "torch.txt")
        import torch.multiprocessing as mp
        mp.spawn(torch_allreduce, args=(n, sizes, os.path.join(tmp, "init"), out), nprocs=n)
        peer = {int(l.split()[0]): float(l.split()[1]) for l in open(out)}
        print(f"| bytes | kiln ms | kiln busbw GB/s | torch ms | torch busbw GB/s | kiln/torch busbw |")
        print("|---|---|---|---|---|---|")
        for s in sizes:
            kb, tb = bus(s, kiln[s], n), bus(s, peer[s], n)
            ratio = kb / tb if tb > 0 else float("nan")
            print(f"| {s} | {kiln[s]:.4f} | {kb:.1f} | {peer[s]:.4f} | {tb:.1f} | {ratio:.3f} |")
            print(f"ratio allreduce_{s} {kiln[s]:.4f} {peer[s]:.4f}")
    if "resnet50" in whats:
        res = {}
        for ranks in sorted({1, n}):
            for r in kiln_lines(a.bundle, ranks, ["resnet50"]):
                if r[1] == "resnet50_dp":
                    res[int(r[2])] = (float(r[3]), float(r[4]))
        if 1 in res and n in res and n > 1:
            print(f"resnet50 data-parallel: {res[1][1]:.0f} images/s on 1 GPU, {res[n][1]:.0f} on {n}: "
                  f"scaling {res[n][1] / res[1][1]:.2f}x (goal >= {0.9 * n:.1f}x)")
        for k, (ms, ips) in sorted(res.items()):
            print(f"kiln resnet50_dp ranks={k} {ms:.3f} ms/step {ips:.0f} images/s")


if __name__ == "__main__":
    main()
