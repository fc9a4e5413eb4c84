"""Golden gradients from PyTorch for kiln's autodiff tests (tests/autodiff/test_golden_torch.cpp).

usage: python scripts/golden_grads.py OUT_DIR     (needs torch and numpy; run once, commit OUT_DIR)

Two models in float64, with inputs and weights drawn from a fixed seed and stored as float32 (so
they are exact in both frameworks), and float64 losses and gradients:
  mlp: 784-256-Softshrink-10 with softmax cross entropy (mean)
  cnn: conv 3->4 (3x3, pad 1) -> batch_norm (training: batch statistics) -> relu -> max_pool 2
       -> flatten -> linear 64->5 -> softmax cross entropy (mean); dropout off
"""
import pathlib
import sys

import numpy as np
import torch
import torch.nn.functional as F


def save(out: pathlib.Path, name: str, value) -> None:
    if isinstance(value, torch.Tensor):
        value = value.detach().numpy()
    np.save(out / f"{name}.npy", value)


def f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def mlp(out: pathlib.Path, rng) -> None:
    x, w1, b1 = f32(rng, 4, 784), f32(rng, 256, 784, scale=0.05), f32(rng, 256, scale=0.1)
    w2, b2 = f32(rng, 10, 256, scale=0.1), f32(rng, 10, scale=0.1)
    y = rng.integers(0, 10, 4).astype(np.int64)
    for name, v in dict(x=x, w1=w1, b1=b1, w2=w2, b2=b2, y=y).items():
        save(out, f"mlp_{name}", v)
    t = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True)
         for k, v in dict(x=x, w1=w1, b1=b1, w2=w2, b2=b2).items()}
    h = F.softshrink(F.linear(t["x"], t["w1"], t["b1"]), 0.5)
    loss = F.cross_entropy(F.linear(h, t["w2"], t["b2"]), torch.tensor(y))
    loss.backward()
    save(out, "mlp_loss", loss)
    for k, v in t.items():
        save(out, f"mlp_grad_{k}", v.grad)


def cnn(out: pathlib.Path, rng) -> None:
    x, cw, cb = f32(rng, 4, 3, 8, 8), f32(rng, 4, 3, 3, 3, scale=0.3), f32(rng, 4, scale=0.1)
    gamma, beta = f32(rng, 4, scale=0.2) + 1, f32(rng, 4, scale=0.1)
    lw, lb = f32(rng, 5, 64, scale=0.2), f32(rng, 5, scale=0.1)
    y = rng.integers(0, 5, 4).astype(np.int64)
    for name, v in dict(x=x, cw=cw, cb=cb, gamma=gamma, beta=beta, lw=lw, lb=lb, y=y).items():
        save(out, f"cnn_{name}", v)
    t = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True)
         for k, v in dict(x=x, cw=cw, cb=cb, gamma=gamma, beta=beta, lw=lw, lb=lb).items()}
    h = F.conv2d(t["x"], t["cw"], t["cb"], padding=1)
    h = F.batch_norm(h, None, None, t["gamma"], t["beta"], training=True, eps=1e-5)
    h = F.max_pool2d(F.relu(h), 2)
    loss = F.cross_entropy(F.linear(h.flatten(1), t["lw"], t["lb"]), torch.tensor(y))
    loss.backward()
    save(out, "cnn_loss", loss)
    for k, v in t.items():
        save(out, f"cnn_grad_{k}", v.grad)


def main() -> None:
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data/golden")
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20261129)
    mlp(out, rng)
    cnn(out, rng)
    print(f"torch {torch.__version__}: wrote golden gradients to {out}")


if __name__ == "__main__":
    main()
