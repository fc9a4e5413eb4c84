#!/usr/bin/env python3
"""kiln beside PyTorch eager on one GPU, in one call on the GPU machine.

Runs the PyTorch versions of the workloads of kiln_bench_gpu (eager, timed with CUDA events,
median of --reps runs after warm-up), then the kiln binary once per workload (so one failing or
hanging workload cannot take the others with it), and prints a markdown table:

    workload | kiln ms | PyTorch eager ms | ratio (kiln/PyTorch) | best peer in DEVICE.md

The table also goes to --out, followed by the notes and kiln's own report lines.

    python3 bench/gpu/run.py --out gpu-bench.md [--kiln build-gpu/bundle/bench/kiln_bench_gpu]

--torch-compile also times torch.compile(mode="reduce-overhead") for the inference workloads it
applies to (ResNet-50, BERT-base), in the same call, and the ratio is then to the faster of eager
and compiled. --kiln-before BINARY runs a second kiln build (an earlier commit's bundle) on the
same workloads, for a before/after column measured in the same call.
"""
import argparse
import glob
import os
import site
import statistics
import subprocess
import sys
import tarfile
import time
import traceback

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DEFAULT_KILN = "build-gpu/bundle/bench/kiln_bench_gpu"

# name, what, best figure of the peer table in DEVICE.md (ms, where it comes from)
WORKLOADS = [
    ("resnet50_infer_bs1_f32", "ResNet-50 inference bs1 f32",
     (0.912, "torch.compile reduce-overhead, TF32 (eager 4.68)")),
    ("resnet50_infer_bs1_bf16", "ResNet-50 inference bs1 bf16",
     (0.740, "torch.compile reduce-overhead, bf16 channels-last")),
    ("resnet50_infer_bs32_f32", "ResNet-50 inference bs32 f32",
     (3.83, "torch.compile reduce-overhead, TF32 (eager 7.84, eager TF32 6.06)")),
    ("resnet50_infer_bs32_bf16", "ResNet-50 inference bs32 bf16",
     (1.96, "torch.compile max-autotune, bf16 channels-last (eager 7.83)")),
    ("resnet50_infer_bs1_tf32", "ResNet-50 inference bs1 f32, TF32 allowed on both sides",
     (0.912, "torch.compile reduce-overhead, TF32")),
    ("resnet50_infer_bs32_tf32", "ResNet-50 inference bs32 f32, TF32 allowed on both sides",
     (3.83, "torch.compile reduce-overhead, TF32 (eager TF32 6.06)")),
    ("resnet50_train_bs32_f32", "ResNet-50 training step bs32 f32, SGD",
     (24.1, "eager")),
    ("resnet50_train_bs32_bf16", "ResNet-50 training step bs32 bf16 autocast, SGD",
     (22.0, "eager autocast (compiled forward: 31.9)")),
    ("resnet50_compile", "ResNet-50 compile for the GPU (bs32 f32)",
     (15.3e3, "torch.compile reduce-overhead bs32 f32 (default mode, first call: 24.8 s)")),
    ("mlp_adam_bs256", "MLP 784-256(Softshrink)-10 Adam step bs256",
     (1.12, "eager")),
    ("maxpool_fwd_bwd", "max-pool 3x3 s2 p1 fwd+bwd with indices, 32x64x112x112 f32",
     (0.512, "eager")),
    ("lstm_train", "LSTM 2 layers x 512, seq 100, batch 64, f32, fwd+bwd",
     (9.04, "nn.LSTM on cuDNN, eager")),
    ("gru_train", "GRU 2 layers x 512, seq 100, batch 64, f32, fwd+bwd",
     (None, "nn.GRU on cuDNN, eager")),
    ("sdpa_bf16", "attention 32x12x128x64 bf16, forward",
     (None, "F.scaled_dot_product_attention")),
    ("sdpa_f32", "attention 32x12x128x64 f32, forward",
     (None, "F.scaled_dot_product_attention (f32, TF32 off)")),
    ("bert_base_bf16_onnx", "BERT-base inference bs32 seq128 bf16 (kiln: from ONNX, autocast)",
     (9.61, "eager, bf16, SDPA attention")),
    ("tiny_add_x1000", "1000 dependent tiny adds, replayed graph (µs per op; peer: CUDA graph)",
     (1.14, "one CUDA graph replay (eager 10.6)")),
    ("tiny_add_x1000_plain", "1000 dependent tiny adds, one launch each (µs per op; peer: eager)",
     (10.6, "eager")),
    ("tiny_add_x1000_fused", "1000 dependent tiny adds, fused (µs per op; peer: CUDA graph)",
     (1.14, "one CUDA graph replay (eager 10.6)")),
]
NAMES = [w[0] for w in WORKLOADS]


# ---- PyTorch ----

def strict_f32(torch):
    """Turns TF32 off for matmuls and convolutions, so f32 rows compare true f32 math."""
    try:
        cudnn_conv = getattr(torch.backends.cudnn, "conv", None)
        if cudnn_conv is not None and hasattr(cudnn_conv, "fp32_precision"):
            torch.backends.cuda.matmul.fp32_precision = "ieee"
            cudnn_conv.fp32_precision = "ieee"
            return "fp32_precision = ieee (TF32 off)"
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        return "allow_tf32 = False (TF32 off)"
    except Exception as e:  # the rows still come, with PyTorch's default precision
        return f"TF32 setting failed ({e}), PyTorch defaults"


def set_tf32(torch, on):
    """TF32 on or off for PyTorch's matmuls and convolutions (the f32 rows run with it off)."""
    cudnn_conv = getattr(torch.backends.cudnn, "conv", None)
    if cudnn_conv is not None and hasattr(cudnn_conv, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = "tf32" if on else "ieee"
        cudnn_conv.fp32_precision = "tf32" if on else "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on


def cuda_median_ms(torch, fn, reps, warmup):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def torch_workloads(torch, compiled=False):
    """name -> function(reps, warmup) giving the median ms of the PyTorch version; with
    `compiled`, only the inference workloads, each through torch.compile(mode="reduce-overhead")
    (timed after warm-up runs that compile and record it)."""
    import torch.nn as nn
    import torch.nn.functional as F
    import torchvision

    dev = "cuda"

    def run_of(model):
        if not compiled:
            return model
        return torch.compile(model, mode="reduce-overhead")

    def resnet_infer(batch, bf16, tf32=False):
        def bench(reps, warmup):
            model = torchvision.models.resnet50().to(dev).eval()
            x = torch.randn(batch, 3, 224, 224, device=dev)
            if bf16 or tf32:  # as the peers: channels-last (the whole model in bf16 for bf16)
                dt = torch.bfloat16 if bf16 else torch.float32
                model = model.to(memory_format=torch.channels_last, dtype=dt)
                x = x.to(memory_format=torch.channels_last, dtype=dt)
            if tf32:
                set_tf32(torch, True)
            run = run_of(model)
            try:
                with torch.inference_mode():
                    return cuda_median_ms(torch, lambda: run(x), reps, warmup)
            finally:
                if tf32:
                    set_tf32(torch, False)
        return bench

    def resnet_train(bf16):
        def bench(reps, warmup):
            model = torchvision.models.resnet50().to(dev).train()
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            x = torch.randn(32, 3, 224, 224, device=dev)
            y = torch.randint(0, 1000, (32,), device=dev)

            def step():
                opt.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                    loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
            return cuda_median_ms(torch, step, reps, warmup)
        return bench

    def mlp(reps, warmup):
        model = nn.Sequential(nn.Linear(784, 256), nn.Softshrink(), nn.Linear(256, 10)).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x = torch.randn(256, 784, device=dev)
        y = torch.randint(0, 10, (256,), device=dev)

        def step():
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
        return cuda_median_ms(torch, step, reps, warmup)

    def maxpool(reps, warmup):
        x = torch.randn(32, 64, 112, 112, device=dev, requires_grad=True)
        gy = torch.randn(32, 64, 56, 56, device=dev)

        def fwd_bwd():
            y, _ = F.max_pool2d(x, 3, 2, 1, return_indices=True)
            torch.autograd.grad(y, x, gy)
        return cuda_median_ms(torch, fwd_bwd, reps, warmup)

    def recurrent(cls):
        def run(reps, warmup):
            m = cls(512, 512, 2).to(dev)
            x = torch.randn(100, 64, 512, device=dev, requires_grad=True)
            gy = torch.randn(100, 64, 512, device=dev)

            def step():
                y, _ = m(x)
                torch.autograd.grad(y, [x] + list(m.parameters()), gy)
            return cuda_median_ms(torch, step, reps, warmup)
        return run

    def lstm(reps, warmup):
        m = nn.LSTM(512, 512, 2).to(dev)
        x = torch.randn(100, 64, 512, device=dev, requires_grad=True)
        gy = torch.randn(100, 64, 512, device=dev)

        def step():
            y, _ = m(x)
            torch.autograd.grad(y, [x] + list(m.parameters()), gy)
        return cuda_median_ms(torch, step, reps, warmup)

    def sdpa_of(dtype):
        def run(reps, warmup):
            q, k, v = (torch.randn(32, 12, 128, 64, device=dev, dtype=dtype) for _ in range(3))
            return cuda_median_ms(torch, lambda: F.scaled_dot_product_attention(q, k, v), reps,
                                  warmup)
        return run

    def bert(reps, warmup):
        model = run_of(bert_base(torch, "sdpa").to(dev, torch.bfloat16).eval())
        ids, mask = bert_inputs(torch)
        ids, mask = ids.to(dev), mask.to(dev)
        with torch.inference_mode():
            return cuda_median_ms(torch, lambda: model(input_ids=ids, attention_mask=mask),
                                  reps, warmup)

    def tiny(reps, warmup):
        x0 = torch.zeros(1, device=dev)

        def chain():
            x = x0
            for _ in range(1000):
                x = x + 1
            return x
        return cuda_median_ms(torch, chain, reps, warmup)

    def tiny_graph(reps, warmup):
        x0 = torch.zeros(1, device=dev)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up off the default stream, as capture requires
            for _ in range(3):
                x = x0
                for _ in range(1000):
                    x = x + 1
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            x = x0
            for _ in range(1000):
                x = x + 1
        return cuda_median_ms(torch, graph.replay, reps, warmup)

    if compiled:
        return {
            "resnet50_infer_bs1_bf16": resnet_infer(1, True),
            "resnet50_infer_bs32_bf16": resnet_infer(32, True),
            "resnet50_infer_bs1_tf32": resnet_infer(1, False, tf32=True),
            "resnet50_infer_bs32_tf32": resnet_infer(32, False, tf32=True),
            "bert_base_bf16_onnx": bert,
        }
    return {
        "resnet50_infer_bs1_f32": resnet_infer(1, False),
        "resnet50_infer_bs1_bf16": resnet_infer(1, True),
        "resnet50_infer_bs32_f32": resnet_infer(32, False),
        "resnet50_infer_bs32_bf16": resnet_infer(32, True),
        "resnet50_infer_bs1_tf32": resnet_infer(1, False, tf32=True),
        "resnet50_infer_bs32_tf32": resnet_infer(32, False, tf32=True),
        "resnet50_train_bs32_f32": resnet_train(False),
        "resnet50_train_bs32_bf16": resnet_train(True),
        "mlp_adam_bs256": mlp,
        "maxpool_fwd_bwd": maxpool,
        "lstm_train": lstm,
        "gru_train": recurrent(nn.GRU),
        "sdpa_bf16": sdpa_of(torch.bfloat16),
        "sdpa_f32": sdpa_of(torch.float32),
        "bert_base_bf16_onnx": bert,
        "tiny_add_x1000": tiny_graph,
        "tiny_add_x1000_plain": tiny,
        "tiny_add_x1000_fused": tiny_graph,
    }


BERT_BATCH, BERT_TOKENS = 32, 128


def bert_base(torch, attention):
    """transformers' BertModel with bert-base-uncased's configuration and random weights."""
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    cfg = BertConfig()
    cfg._attn_implementation = attention  # "sdpa" for PyTorch's run, "eager" for the export
    return BertModel(cfg, add_pooling_layer=False)


def bert_inputs(torch):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 30522, (BERT_BATCH, BERT_TOKENS), generator=g)
    return ids, torch.ones(BERT_BATCH, BERT_TOKENS, dtype=torch.int64)


def export_bert_base(directory, dynamic=False):
    """Writes DIRECTORY/bert_base.onnx (f32, last_hidden_state) for kiln's bert_base_bf16_onnx,
    with PyTorch's TorchScript exporter (opset 17), on the CPU; with `dynamic`,
    DIRECTORY/bert_base_dynamic.onnx with batch and seq as dim_params (bench/gpu/bert_dynamic.py)."""
    import torch

    class Hidden(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    model = Hidden(bert_base(torch, "eager")).eval()
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "bert_base_dynamic.onnx" if dynamic else "bert_base.onnx")
    dims = {0: "batch", 1: "seq"}
    axes = {"input_ids": dims, "attention_mask": dims, "last_hidden_state": dims}
    t0 = time.time()
    with torch.no_grad():
        torch.onnx.export(model, bert_inputs(torch), path, dynamo=False, opset_version=17,
                          input_names=["input_ids", "attention_mask"],
                          output_names=["last_hidden_state"], dynamic_axes=axes if dynamic else None)
    print(f"exported {path} ({os.path.getsize(path) / 2**20:.0f} MiB, "
          f"{time.time() - t0:.1f} s)", flush=True)
    return directory


def run_torch(names, reps, warmup, notes, compiled=False):
    """name -> ms (float) or an error text (with `compiled`: torch.compile's, for the workloads
    it applies to)."""
    results = {}
    try:
        import torch
        import torchvision
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        mode = 'torch.compile(mode="reduce-overhead")' if compiled else "eager"
        notes.append(f"PyTorch {torch.__version__}, torchvision {torchvision.__version__}, "
                     f"{torch.cuda.get_device_name(0)}; {mode}, cudnn.benchmark="
                     f"{torch.backends.cudnn.benchmark}; f32 rows: {strict_f32(torch)}; "
                     "CUDA events, median of "
                     f"{reps} after {warmup} warm-up runs")
        benches = torch_workloads(torch, compiled)
    except Exception as e:  # no torch: the kiln column still comes
        for n in names:
            results[n] = f"PyTorch unavailable: {e}"
        return results
    for n in names:
        if n not in benches:
            continue
        try:
            t0 = time.time()
            results[n] = benches[n](reps, warmup)
            what = "torch.compile" if compiled else "torch"
            print(f"{what} {n} {results[n]:.4f}   ({time.time() - t0:.1f} s)", flush=True)
        except Exception as e:
            results[n] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
            print(f"torch {n} error {results[n]}", flush=True)
            traceback.print_exc()
        finally:
            torch.cuda.empty_cache()
    return results


# ---- kiln ----

def kiln_binary(path):
    """The binary's absolute path; unpacks the GPU bundle when only its archive is there."""
    candidates = [path]
    if not os.path.isabs(path):
        candidates = [os.path.abspath(path), os.path.join(REPO, path)]
    for p in candidates:
        if os.path.isfile(p):
            return p
    for p in candidates:  # .../BUILD/bundle/bench/kiln_bench_gpu <- .../BUILD/bundle.tar.xz
        build = os.path.dirname(os.path.dirname(os.path.dirname(p)))
        archive = os.path.join(build, "bundle.tar.xz")
        if os.path.isfile(archive):
            with tarfile.open(archive) as t:
                t.extractall(build)
            if os.path.isfile(p):
                return p
    return candidates[-1]


def kiln_env(binary):
    """The bundle's own libraries, then the CUDA libraries of the Python environment."""
    libs = []
    bundle_lib = os.path.normpath(os.path.join(os.path.dirname(binary), "..", "lib"))
    if os.path.isdir(bundle_lib):
        libs.append(bundle_lib)
    for sp in site.getsitepackages():
        libs += sorted(glob.glob(os.path.join(sp, "nvidia", "*", "lib")))
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join(libs + [env.get("LD_LIBRARY_PATH", "")])
    return env


def run_kiln(binary, device, names, reps, per_timeout, budget_s, log, onnx_dir=None):
    """name -> ms (float) or an error text. One process per workload."""
    results = {}
    binary = kiln_binary(binary)
    if not os.path.isfile(binary):
        return {n: f"kiln binary not found: {binary}" for n in names}
    env = kiln_env(binary)
    deadline = time.time() + budget_s
    for n in names:
        left = deadline - time.time()
        if left < 5:
            results[n] = "skipped: the time budget for kiln ran out"
            continue
        timeout = min(per_timeout, left)
        cmd = [binary, "--device", device, "--only", n, "--reps", str(reps)]
        if onnx_dir:
            cmd += ["--onnx-dir", onnx_dir]
        t0 = time.time()
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            out, err, rc = p.stdout, p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            def text(b):
                return (b.decode(errors="replace") if isinstance(b, bytes) else b) or ""
            out, err, rc = text(e.stdout), text(e.stderr), None
        except OSError as e:
            out, err, rc = "", str(e), -1
        log.append(f"$ {' '.join(cmd)}   ({time.time() - t0:.1f} s, exit {rc})")
        log += out.splitlines()
        log += ["stderr: " + line for line in err.splitlines()[-20:]]
        results[n] = parse_kiln(n, out, err, rc, timeout)
        shown = results[n] if isinstance(results[n], str) else f"{results[n]:.4f}"
        print(f"kiln {n} {shown}   ({time.time() - t0:.1f} s)", flush=True)
    return results


def parse_kiln(name, out, err, rc, timeout):
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) >= 3 and parts[0] == "kiln" and parts[1] == name:
            if parts[2] == "error":
                return "error: " + (parts[3] if len(parts) > 3 else "")
            try:
                return float(parts[2])
            except ValueError:
                return f"unreadable line: {line[:200]}"
    if rc is None:
        return f"timed out after {timeout:.0f} s"
    last = (err.strip().splitlines() or out.strip().splitlines() or ["no output"])[-1]
    return f"exit {rc}: {last[:200]}"


# ---- table ----

def fmt_ms(v):
    if v >= 1000:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.2f}"
    return f"{v:.3f}"


def cell(v):
    if v is None:
        return "—"
    if isinstance(v, str):
        return "**" + v.replace("|", "/").replace("\n", " ") + "**"
    return fmt_ms(v)


def table(names, kiln, torch_ms, compiled_ms=None, before=None):
    """The markdown table; compiled_ms (torch.compile) and before (an earlier kiln) add columns
    when given. The ratio is kiln over the faster of the PyTorch columns."""
    head = "| workload | kiln ms |"
    if before is not None:
        head += " kiln before ms | after/before |"
    head += " PyTorch eager ms |"
    if compiled_ms is not None:
        head += " torch.compile ms |"
    head += " ratio (kiln/best PyTorch) | DEVICE.md best peer |"
    rows = [head, "|" + "---|" * (head.count("|") - 1)]

    def ratio(a, b):
        ok = isinstance(a, float) and isinstance(b, float) and b > 0
        return f"{a / b:.2f}" if ok else "—"
    for name, what, (peer_ms, peer_src) in WORKLOADS:
        if name not in names:
            continue
        k, t = kiln.get(name), torch_ms.get(name)
        row = f"| {what} (`{name}`) | {cell(k)} |"
        if before is not None:
            b = before.get(name)
            row += f" {cell(b)} | {ratio(k, b)} |"
        row += f" {cell(t)} |"
        best = t
        if compiled_ms is not None:
            c = compiled_ms.get(name)
            row += f" {cell(c)} |"
            if isinstance(c, float) and (not isinstance(best, float) or c < best):
                best = c
        if peer_ms is None:
            peer = "—"
        else:
            peer = (f"{peer_ms / 1000:.1f} s" if peer_ms >= 1000 else f"{fmt_ms(peer_ms)} ms")
        rows.append(row + f" {ratio(k, best)} | {peer} ({peer_src}) |")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kiln", default=DEFAULT_KILN, help="the kiln_bench_gpu binary")
    ap.add_argument("--out", help="also write the table (and the logs) to this markdown file")
    ap.add_argument("--only", help="comma-separated workload names (default: all)")
    ap.add_argument("--kiln-device", default="cuda:0", help="cpu: a smoke test without a GPU")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5, help="PyTorch warm-up runs")
    ap.add_argument("--kiln-timeout", type=float, default=90, help="seconds per kiln workload")
    ap.add_argument("--kiln-budget", type=float, default=210, help="seconds for all of kiln")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--torch-compile", action="store_true",
                    help="also torch.compile(mode='reduce-overhead') where it applies")
    ap.add_argument("--kiln-before", help="an earlier kiln_bench_gpu, for a before/after column")
    ap.add_argument("--skip-kiln", action="store_true")
    ap.add_argument("--onnx-dir", default="/tmp/kiln-bench-onnx",
                    help="where the BERT-base ONNX model for kiln is exported")
    args = ap.parse_args()

    names = NAMES
    if args.only:
        wanted = [s for s in args.only.split(",") if s]
        unknown = [s for s in wanted if s not in NAMES]
        if unknown:
            ap.error(f"unknown workloads {unknown}; known: {', '.join(NAMES)}")
        names = [n for n in NAMES if n in wanted]

    notes, log = [], []
    t0 = time.time()
    torch_ms = {} if args.skip_torch else run_torch(names, args.reps, args.warmup, notes)
    compiled_ms = None
    if args.torch_compile and not args.skip_torch:
        compiled_ms = run_torch(names, args.reps, max(args.warmup, 5), notes, compiled=True)
    t_torch = time.time() - t0
    onnx_dir = None
    if "bert_base_bf16_onnx" in names and not args.skip_kiln:
        try:  # the model kiln imports, exported here (no network: random weights)
            onnx_dir = export_bert_base(args.onnx_dir)
        except Exception as e:
            print(f"exporting BERT-base to ONNX failed: {e}", flush=True)
            traceback.print_exc()
    kiln = {} if args.skip_kiln else run_kiln(args.kiln, args.kiln_device, names, args.reps,
                                               args.kiln_timeout, args.kiln_budget, log,
                                               onnx_dir)
    before = None
    if args.kiln_before and not args.skip_kiln:
        log.append("# the earlier kiln (--kiln-before)")
        before = run_kiln(args.kiln_before, args.kiln_device, names, args.reps, args.kiln_timeout,
                          args.kiln_budget, log, onnx_dir)
        notes.append(f"kiln before: {os.path.relpath(kiln_binary(args.kiln_before), REPO)}, "
                     "run after the kiln column, the same way")
    notes.append(f"kiln: {os.path.relpath(kiln_binary(args.kiln), REPO)}, one process per "
                 f"workload, wall clock around Executable::run (synchronizing), median of "
                 f"{args.reps}; bf16 inference: the whole model in bf16 (NCHW); bf16 training: "
                 f"CompileOptions::autocast (convs and linear in bf16)")
    notes.append("PyTorch bf16 inference: model and input in bf16, channels-last; bf16 training: "
                 "torch.autocast(bfloat16), NCHW")
    notes.append(f"PyTorch part {t_torch:.0f} s, kiln part {time.time() - t0 - t_torch:.0f} s")

    result = table(names, kiln, torch_ms, compiled_ms, before)
    text = result + "\n\n" + "\n".join("- " + n for n in notes) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
            f.write("\n<details><summary>kiln output</summary>\n\n```\n")
            f.write("\n".join(log) + "\n```\n</details>\n")
    print()
    for line in log:
        if line.startswith("#") or line.startswith("$") or " error " in line:
            print(line)
    print()
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
