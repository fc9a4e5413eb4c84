#!/usr/bin/env python3
"""Golden data of kiln's lstm / gru / rnn ops from PyTorch (nn.LSTM, nn.GRU, nn.RNN).

    python make_golden.py OUT_DIR        # e.g. tests/data/rnn/golden

For every case below it writes, with numpy.save, into OUT_DIR:
    <case>_x.npy                  input, (T, B, I) or (B, T, I) with batch_first
    <case>_h0.npy, <case>_c0.npy  initial states (L*D, B, H), when the case has them
    <case>_<param>.npy            every parameter under PyTorch's name (weight_ih_l0,
                                  weight_hh_l0_reverse, bias_ih_l1, ...), PyTorch's gate order
    <case>_y.npy, <case>_hn.npy, <case>_cn.npy     forward outputs (y: (T, B, D*H) / (B, T, D*H))
    <case>_dy.npy, <case>_dhn.npy, <case>_dcn.npy  a fixed random upstream gradient of each output
    <case>_grad_x.npy, <case>_grad_h0.npy, <case>_grad_c0.npy, <case>_grad_<param>.npy
                                  gradients of sum(y*dy) + sum(hn*dhn) [+ sum(cn*dcn)]
and cases.txt, one line per case:
    name cell layers bidirectional batch_first init dtype T B I H

Gate orders: PyTorch stacks LSTM gates as i, f, g, o and GRU gates as r, z, n; kiln (as ONNX)
takes LSTM i, o, f, c and GRU z, r, h. kiln::torch_rnn_weights reorders the blocks of H rows:
LSTM takes PyTorch blocks 0, 3, 1, 2 and GRU blocks 1, 0, 2; bias_ih / bias_hh become the two
halves [Wb, Rb] of kiln's b; PyTorch's GRU is linear_before_reset = true. y's last dim is the
forward direction's H units then the reverse direction's, kiln's (…, D, H) merged.
"""
import os
import sys

import numpy as np
import torch

T, B, I, H = 5, 3, 4, 3

CASES = []
for cell in ("lstm", "gru", "rnn"):
    for layers in (1, 2):
        for bidirectional in (False, True):
            for batch_first in (False, True):
                for init in (False, True):
                    for dtype in ("f32", "f64"):
                        # a subset keeps the data small: every option still appears with every
                        # other at least once per cell
                        if (layers + bidirectional + batch_first + init + (dtype == "f64")) % 2:
                            continue
                        CASES.append((cell, layers, bidirectional, batch_first, init, dtype))


def main(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(1234)
    lines = []
    for cell, layers, bidi, bf, init, dt in CASES:
        name = f"{cell}_l{layers}_{'bi' if bidi else 'uni'}_{'bf' if bf else 'tm'}_{'h0' if init else 'noh0'}_{dt}"
        dtype = torch.float64 if dt == "f64" else torch.float32
        module = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn": torch.nn.RNN}[cell]
        m = module(I, H, num_layers=layers, bidirectional=bidi, batch_first=bf).to(dtype)
        D = 2 if bidi else 1
        x = torch.rand((B, T, I) if bf else (T, B, I), dtype=dtype) * 2 - 1
        x.requires_grad_(True)
        args = [x]
        h0 = c0 = None
        if init:
            h0 = (torch.rand(layers * D, B, H, dtype=dtype) * 2 - 1).requires_grad_(True)
            if cell == "lstm":
                c0 = (torch.rand(layers * D, B, H, dtype=dtype) * 2 - 1).requires_grad_(True)
                args.append((h0, c0))
            else:
                args.append(h0)
        y, state = m(*args)
        hn, cn = state if cell == "lstm" else (state, None)
        dy, dhn = torch.rand_like(y) * 2 - 1, torch.rand_like(hn) * 2 - 1
        loss = (y * dy).sum() + (hn * dhn).sum()
        dcn = None
        if cn is not None:
            dcn = torch.rand_like(cn) * 2 - 1
            loss = loss + (cn * dcn).sum()
        params = dict(m.named_parameters())
        wrt = [x] + ([h0] if h0 is not None else []) + ([c0] if c0 is not None else [])
        wrt += list(params.values())
        grads = torch.autograd.grad(loss, wrt)

        def save(key, t):
            np.save(os.path.join(out, f"{name}_{key}.npy"), t.detach().cpu().numpy())

        save("x", x)
        if h0 is not None:
            save("h0", h0)
        if c0 is not None:
            save("c0", c0)
        for k, p in params.items():
            save(k, p)
        save("y", y)
        save("hn", hn)
        save("dy", dy)
        save("dhn", dhn)
        if cn is not None:
            save("cn", cn)
            save("dcn", dcn)
        gi = iter(grads)
        save("grad_x", next(gi))
        if h0 is not None:
            save("grad_h0", next(gi))
        if c0 is not None:
            save("grad_c0", next(gi))
        for k in params:
            save(f"grad_{k}", next(gi))
        lines.append(f"{name} {cell} {layers} {int(bidi)} {int(bf)} {int(init)} {dt} {T} {B} {I} {H}")
    with open(os.path.join(out, "cases.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} cases to {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_golden.py OUT_DIR")
    main(sys.argv[1])
