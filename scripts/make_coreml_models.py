#!/usr/bin/env python3
"""Writes the Core ML test models of real architectures into tests/data/coreml: small PyTorch
models converted by coremltools (ct.convert of a traced module, its default passes), with their
inputs and PyTorch's outputs as references (NAME.npz: inputs under their names, outputs as
out0, out1, ...). Needs PyTorch and coremltools (not in .venv: run it where both are installed);
python/tests/test_coreml_models.py reads the committed files without either.

  cnn             a small residual convnet (conv, batch norm, relu, max pool, a residual block,
                  global average pool, linear): f32
  encoder         a pre-norm transformer encoder layer (attention over 4 heads, layer norms,
                  a GELU feed-forward, residuals) over (2, 10, 32): f32
  encoder_fp16    the same converted to compute in fp16 (the reference: PyTorch in f32)
  gpt_block       a GPT-style decoder block over token ids (embeddings, causal attention over 4
                  heads, a tanh-GELU feed-forward, the vocabulary head): iOS16 (attention
                  written out) and gpt_block_ios18 (MIL's scaled_dot_product_attention)
  tagger          embeddings, a bidirectional LSTM, a GRU and a log-softmax head
  cnn_palettized  the convnet without batch norms, each weight set to 16 evenly spaced levels
                  and palettized to 4 bits by coremltools (uniform tables: the reference is
                  PyTorch with the same weights)

    make_coreml_models.py [OUT_DIR]"""
import os
import pathlib
import sys
import warnings

import numpy as np

warnings.filterwarnings("ignore")
import coremltools as ct  # noqa: E402
import coremltools.optimize.coreml as cto  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402


class Block(nn.Module):
    def __init__(self, c, norm):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=not norm)
        self.bn1 = nn.BatchNorm2d(c) if norm else nn.Identity()
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=not norm)
        self.bn2 = nn.BatchNorm2d(c) if norm else nn.Identity()

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


class Cnn(nn.Module):
    def __init__(self, norm=True):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(16) if norm else nn.Identity()
        self.pool = nn.MaxPool2d(2)
        self.block = Block(16, norm)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn(self.stem(x))))
        x = self.block(x)
        return torch.softmax(self.head(x.mean(dim=(2, 3))), dim=-1)


class Encoder(nn.Module):
    """A pre-norm transformer encoder layer: attention over 4 heads of 8, then a GELU
    feed-forward, each with a residual (written out: the layers a BERT or ViT block holds)."""

    def __init__(self, d=32, heads=4, ff=64):
        super().__init__()
        self.heads, self.d = heads, d
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ff1, self.ff2 = nn.Linear(d, ff), nn.Linear(ff, d)

    def forward(self, x):
        b, t = 2, 10  # (traced at this shape)
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        split = [b, t, self.heads, self.d // self.heads]
        q, k, v = (z.reshape(split).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-2, -1) / (self.d // self.heads) ** 0.5, dim=-1)
        x = x + self.out((att @ v).transpose(1, 2).reshape(b, t, self.d))
        return x + self.ff2(torch.nn.functional.gelu(self.ff1(self.ln2(x))))


class GptBlock(nn.Module):
    """A GPT-style decoder block over token ids (2, 12): embeddings and learned positions, causal
    scaled-dot-product attention over 4 heads, a tanh-GELU feed-forward, the vocabulary head."""

    def __init__(self, vocab=50, d=32, heads=4):
        super().__init__()
        self.heads, self.d = heads, d
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.randn(12, d))
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ff1, self.ff2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        b, t = 2, 12  # (traced at this shape)
        x = self.emb(ids) + self.pos
        q, k, v = self.qkv(self.ln1(x)).split(self.d, -1)
        q, k, v = (z.view(b, t, self.heads, self.d // self.heads).transpose(1, 2)
                   for z in (q, k, v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(y.transpose(1, 2).reshape(b, t, self.d))
        x = x + self.ff2(torch.nn.functional.gelu(self.ff1(self.ln2(x)), approximate="tanh"))
        return self.head(x)


class Tagger(nn.Module):
    """A sequence tagger: embeddings, a bidirectional LSTM, a GRU and a log-softmax head."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 16)
        self.lstm = nn.LSTM(16, 24, batch_first=True, bidirectional=True)
        self.gru = nn.GRU(48, 16, batch_first=True)
        self.out = nn.Linear(16, 5)

    def forward(self, ids):
        y, _ = self.lstm(self.emb(ids))
        y, _ = self.gru(y)
        return torch.log_softmax(self.out(y), -1)


def randomize_norms(model, g):
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=g) * 0.1)


def convert(module, example, name, precision=ct.precision.FLOAT32, target=ct.target.iOS16):
    traced = torch.jit.trace(module, example, check_trace=False)
    dtype = np.int32 if not example.is_floating_point() else np.float32
    return ct.convert(traced, inputs=[ct.TensorType(name=name, shape=example.shape, dtype=dtype)],
                      convert_to="mlprogram", compute_precision=precision,
                      minimum_deployment_target=target)


def save(out, stem, mlmodel, inputs, outputs):
    mlmodel.save(str(out / f"{stem}.mlpackage"))
    arrays = dict(inputs)
    for k, o in enumerate(outputs):
        arrays[f"out{k}"] = o
    np.savez(out / f"{stem}.npz", **arrays)
    print(f"wrote {stem}.mlpackage and {stem}.npz")


def snap_to_16_levels(model):
    """Each weight of 256 elements or more set to the nearest of 16 levels spaced evenly from its
    minimum to its maximum: the table coremltools' uniform 4-bit palettizer makes for it, so the
    palettized model computes what PyTorch computes with these weights."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.numel() < 256 or not name.endswith("weight"):
                continue
            lo, hi = p.min(), p.max()
            step = (hi - lo) / 15
            p.copy_(lo + torch.round((p - lo) / step) * step)


def main():
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else
                       pathlib.Path(__file__).parents[1] / "tests/data/coreml")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)

    cnn = Cnn().eval()
    with torch.no_grad():
        randomize_norms(cnn, g)
    x = torch.randn(2, 3, 32, 32, generator=g)
    with torch.no_grad():
        want = cnn(x).numpy()
    m = convert(cnn, x, "image")
    save(out, "cnn", m, {"image": x.numpy()}, [want])

    # palettized: a convnet without batch norms (which the conversion would fold into the
    # weights), its weights on 16 levels each, palettized per tensor by coremltools
    pal = Cnn(norm=False).eval()
    snap_to_16_levels(pal)
    with torch.no_grad():
        want_p = pal(x).numpy()
    cfg = cto.OptimizationConfig(global_config=cto.OpPalettizerConfig(
        mode="uniform", nbits=4, weight_threshold=256))
    p = cto.palettize_weights(convert(pal, x, "image"), cfg)
    save(out, "cnn_palettized", p, {"image": x.numpy()}, [want_p])

    enc = Encoder().eval()
    s = torch.randn(2, 10, 32, generator=g)
    with torch.no_grad():
        want = enc(s).numpy()
    save(out, "encoder", convert(enc, s, "tokens"), {"tokens": s.numpy()}, [want])
    save(out, "encoder_fp16", convert(enc, s, "tokens", ct.precision.FLOAT16),
         {"tokens": s.numpy()}, [want])

    # token-id models: the GPT block converted for iOS16 (attention written out) and iOS18 (its
    # scaled_dot_product_attention op), the tagger (MIL lstm and gru from the PyTorch frontend)
    gpt = GptBlock().eval()
    ids = torch.randint(0, 50, (2, 12), generator=g)
    with torch.no_grad():
        want = gpt(ids).numpy()
    feeds = {"ids": ids.numpy().astype(np.int32)}
    save(out, "gpt_block", convert(gpt, ids, "ids"), feeds, [want])
    save(out, "gpt_block_ios18", convert(gpt, ids, "ids", target=ct.target.iOS18), feeds, [want])
    tagger = Tagger().eval()
    ids = torch.randint(0, 100, (2, 7), generator=g)
    with torch.no_grad():
        want = tagger(ids).numpy()
    save(out, "tagger", convert(tagger, ids, "ids"), {"ids": ids.numpy().astype(np.int32)},
         [want])


if __name__ == "__main__":
    main()
