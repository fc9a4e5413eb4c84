#!/usr/bin/env python3
"""The PyTorch peer of kiln_bench_determinism: the same three training steps (bench/gpu/
determinism_nets.h at NetSizes::bench(): a ResNet-shaped CNN with SGD, a BERT-tiny-shaped encoder
with AdamW, a two-layer LSTM with Adam; f32, batch 32) in PyTorch eager, without and with
`torch.use_deterministic_algorithms(True)` (cuDNN deterministic, benchmark off,
CUBLAS_WORKSPACE_CONFIG=:4096:8). Each mode runs in a process of its own, since the cuBLAS
workspace setting must precede CUDA's start. Prints one line per model and mode:

    torch-determinism <model> <off|on> <median ms>

and, given kiln_bench_determinism's output (--kiln FILE), the table of both with the ratios.

    determinism_torch.py [--reps 30] [--warmup 5] [--kiln kiln_bench_determinism.txt]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time


def build(name, torch, nn, F, dev):
    g = torch.Generator().manual_seed(1)

    def uniform(shape, lo, hi):
        return (torch.rand(shape, generator=g) * (hi - lo) + lo).to(dev)

    def ints(shape, n):
        return torch.randint(0, n, shape, generator=g).to(dev)

    B = 32
    if name == "resnet_small":
        w = 64

        def cbr(cin, cout, k, s):
            return [nn.Conv2d(cin, cout, k, s, k // 2, bias=False), nn.BatchNorm2d(cout)]

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.stem = nn.Sequential(*cbr(3, w, 3, 1), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
                self.b1 = nn.Sequential(*cbr(w, w, 3, 1), nn.ReLU(), *cbr(w, w, 3, 1))
                self.b2 = nn.Sequential(*cbr(w, 2 * w, 3, 2), nn.ReLU(), *cbr(2 * w, 2 * w, 3, 1))
                self.down = nn.Sequential(*cbr(w, 2 * w, 1, 2))
                self.fc = nn.Linear(2 * w, 10)

            def forward(self, x):
                h = self.stem(x)
                h = F.relu(self.b1(h) + h)
                h = F.relu(self.b2(h) + self.down(h))
                return self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1))

        model = Net().to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        batches = [(uniform((B, 3, 32, 32), -2, 2), ints((B,), 10)) for _ in range(3)]
        return model, opt, batches, lambda m, b: F.cross_entropy(m(b[0]), b[1])
    if name == "bert_tiny":
        L, H, heads, mlp, layers, vocab = 128, 256, 4, 1024, 4, 1000

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.q, self.k, self.v, self.o = (nn.Linear(H, H) for _ in range(4))
                self.n1, self.n2 = nn.LayerNorm(H), nn.LayerNorm(H)
                self.up, self.dn = nn.Linear(H, mlp), nn.Linear(mlp, H)

            def forward(self, h):
                def split(t):
                    return t.view(B, L, heads, H // heads).transpose(1, 2)

                a = F.scaled_dot_product_attention(split(self.q(h)), split(self.k(h)),
                                                   split(self.v(h)))
                h = self.n1(h + self.o(a.transpose(1, 2).reshape(B, L, H)))
                return self.n2(h + self.dn(F.gelu(self.up(h))))

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(vocab, H)
                self.pos = nn.Parameter(torch.zeros(L, H))
                self.norm = nn.LayerNorm(H)
                self.blocks = nn.Sequential(*(Block() for _ in range(layers)))
                self.out = nn.Linear(H, vocab)

            def forward(self, tokens):
                h = self.blocks(self.norm(self.emb(tokens) + self.pos))
                return self.out(h).view(B * L, vocab)

        model = Net().to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        batches = [(ints((B, L), vocab), ints((B * L,), vocab)) for _ in range(3)]
        return model, opt, batches, lambda m, b: F.cross_entropy(m(b[0]), b[1])
    if name == "lstm":
        T, I, Hd = 50, 128, 256

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = nn.LSTM(I, Hd, num_layers=2)
                self.fc = nn.Linear(Hd, 10)

            def forward(self, x):
                return self.fc(self.rnn(x)[0][-1])

        model = Net().to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        batches = [(uniform((T, B, I), -1, 1), ints((B,), 10)) for _ in range(3)]
        return model, opt, batches, lambda m, b: F.cross_entropy(m(b[0]), b[1])
    raise ValueError(name)


MODELS = ("resnet_small", "bert_tiny", "lstm")


def child(mode, reps, warmup):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    det = mode == "on"
    torch.use_deterministic_algorithms(det)
    torch.backends.cudnn.deterministic = det
    torch.backends.cudnn.benchmark = not det
    torch.backends.cuda.matmul.allow_tf32 = False  # kiln's f32 is true f32
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    for name in MODELS:
        model, opt, batches, loss_of = build(name, torch, nn, F, dev)
        times = []
        for i in range(warmup + reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss_of(model, batches[i % len(batches)]).backward()
            opt.step()
            torch.cuda.synchronize()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        print(f"torch-determinism {name} {mode} {statistics.median(times) * 1e3:.3f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--kiln", help="kiln_bench_determinism's output, for the table")
    ap.add_argument("--child", choices=["off", "on"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.reps, a.warmup)
    torch_ms = {}
    for mode in ("off", "on"):
        env = dict(os.environ)
        if mode == "on":
            env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        out = subprocess.run([sys.executable, __file__, "--child", mode, "--reps", str(a.reps),
                              "--warmup", str(a.warmup)], env=env, check=True,
                             capture_output=True, text=True).stdout
        sys.stdout.write(out)
        for m in re.finditer(r"^torch-determinism (\S+) (\S+) ([\d.]+)$", out, re.M):
            torch_ms[m[1], m[2]] = float(m[3])
    if not a.kiln:
        return 0
    # kiln_bench_determinism prints "kiln determinism <model> <ms off> <ms on>" lines
    kiln_ms = {}
    for m in re.finditer(r"^kiln determinism (\S+) ([\d.]+) ([\d.]+)$", open(a.kiln).read(), re.M):
        kiln_ms[m[1], "off"], kiln_ms[m[1], "on"] = float(m[2]), float(m[3])
    print(f"{'model':14} {'kiln off':>9} {'kiln on':>9} {'torch off':>9} {'torch on':>9} "
          f"{'kiln cost':>9} {'torch cost':>10} {'kiln/torch on':>13}")
    for name in MODELS:
        k0, k1 = kiln_ms.get((name, "off")), kiln_ms.get((name, "on"))
        t0, t1 = torch_ms.get((name, "off")), torch_ms.get((name, "on"))
        if None in (k0, k1, t0, t1):
            print(f"{name:14} (missing figures)")
            continue
        print(f"{name:14} {k0:9.3f} {k1:9.3f} {t0:9.3f} {t1:9.3f} {k1 / k0:9.2f} {t1 / t0:10.2f} "
              f"{k1 / t1:13.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
