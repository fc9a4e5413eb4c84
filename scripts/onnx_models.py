#!/usr/bin/env python3
"""Builds small real-architecture models with random weights, exports each with both PyTorch ONNX
exporters (TorchScript, opset 17; dynamo, opset 18+), and writes ONNX Runtime's outputs beside
them in the layout of ONNX's backend tests:

    OUT/<model>_<exporter>/model.onnx
    OUT/<model>_<exporter>/test_data_set_0/input_<i>.pb, output_<i>.pb

Needs torch, torchvision, transformers, onnx and onnxruntime (the GPU machine has them). Models
whose file is under --max-mb are what the repository keeps (tests/data/onnx_models); the suite
runs every case it finds there.

    python3 scripts/onnx_models.py OUT [--only REGEX] [--max-mb 5]

--full exports full-size models instead (ResNet-50 and MobileNetV3-Large at 224x224, BERT-base and
GPT-2 small on 128 tokens; batch 1, one exporter each), which bench/cpu/onnx_models.py
measures beside the small ones; they are too large for the repository.

--dynamic exports the same models with their batch (and sequence, and image height and width,
where the architecture takes any) as dim_params instead, to OUT/<model>_<exporter>_dynamic/
model.onnx without reference data: python/tests/test_onnx_dynamic_models.py runs them at several
shapes against ONNX Runtime (tests/data/onnx_models_dynamic keeps them).
"""
import argparse
import json
import os
import re
import sys
import traceback

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import numpy_helper
from torch import nn

torch.manual_seed(0)
RNG = np.random.default_rng(0)


# ---- models ----

def resnet_small():
    """torchvision's ResNet with BasicBlocks, one per stage, at a quarter of the width."""
    from torchvision.models.resnet import BasicBlock, ResNet

    class Small(ResNet):
        def __init__(self):
            super().__init__(BasicBlock, [1, 1, 1, 1], num_classes=10)
            self.inplanes = 16
            self.conv1 = nn.Conv2d(3, 16, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(16)
            self.layer1 = self._make_layer(BasicBlock, 16, 1)
            self.layer2 = self._make_layer(BasicBlock, 32, 1, stride=2)
            self.layer3 = self._make_layer(BasicBlock, 64, 1, stride=2)
            self.layer4 = self._make_layer(BasicBlock, 128, 1, stride=2)
            self.fc = nn.Linear(128, 10)

    m = Small()
    for mod in m.modules():  # random running statistics, so batch norm does real work
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
    return m, (torch.randn(2, 3, 64, 64),), ["image"]


def cnn(name):
    import torchvision.models as tv
    m = {
        "mobilenet_v3_small": lambda: tv.mobilenet_v3_small(num_classes=10),
        "squeezenet1_1": lambda: tv.squeezenet1_1(num_classes=10),
        "shufflenet_v2_x0_5": lambda: tv.shufflenet_v2_x0_5(num_classes=10),
    }[name]()
    return m, (torch.randn(2, 3, 64, 64),), ["image"]


class Hidden(nn.Module):
    """A transformers model called with keyword arguments, returning its last hidden state (the
    TorchScript exporter passes inputs positionally)."""

    def __init__(self, model, names):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *args):
        return self.model(**dict(zip(self.names, args))).last_hidden_state


def bert():
    from transformers import BertConfig, BertModel
    cfg = BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64)
    m = BertModel(cfg)
    ids = torch.randint(0, 1000, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)
    mask[1, 12:] = 0
    names = ["input_ids", "attention_mask"]
    return Hidden(m, names), (ids, mask), names


def gpt2():
    from transformers import GPT2Config, GPT2Model
    cfg = GPT2Config(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=64, use_cache=False)
    m = GPT2Model(cfg)
    return Hidden(m, ["input_ids"]), (torch.randint(0, 1000, (2, 16)),), ["input_ids"]


def vit():
    from transformers import ViTConfig, ViTModel
    cfg = ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
                    num_attention_heads=4, intermediate_size=128)
    m = ViTModel(cfg, add_pooling_layer=False)
    return Hidden(m, ["pixel_values"]), (torch.randn(2, 3, 32, 32),), ["pixel_values"]


class Tagger(nn.Module):
    """Embedding -> bidirectional LSTM or GRU -> per-token classes."""

    def __init__(self, cell):
        super().__init__()
        self.emb = nn.Embedding(500, 32)
        self.rnn = getattr(nn, cell)(32, 48, num_layers=2, batch_first=True, bidirectional=True)
        self.out = nn.Linear(96, 9)

    def forward(self, ids):
        y, _ = self.rnn(self.emb(ids))
        return self.out(y)


class StyleNet(nn.Module):
    """A small fast-neural-style transformer: reflection pads, instance norm, residual blocks,
    strided convs down, nearest upsampling and a transposed conv up."""

    def __init__(self):
        super().__init__()

        def conv(i, o, k, s):
            return nn.Sequential(nn.ReflectionPad2d(k // 2), nn.Conv2d(i, o, k, s),
                                 nn.InstanceNorm2d(o, affine=True), nn.ReLU())

        self.down = nn.Sequential(conv(3, 8, 9, 1), conv(8, 16, 3, 2), conv(16, 32, 3, 2))
        self.res = nn.ModuleList([nn.Sequential(conv(32, 32, 3, 1), nn.ReflectionPad2d(1),
                                                nn.Conv2d(32, 32, 3), nn.InstanceNorm2d(32, affine=True))
                                  for _ in range(2)])
        self.up1 = nn.Sequential(nn.Upsample(scale_factor=2, mode="nearest"), conv(32, 16, 3, 1))
        self.up2 = nn.ConvTranspose2d(16, 8, 3, stride=2, padding=1, output_padding=1)
        self.last = nn.Sequential(nn.ReflectionPad2d(4), nn.Conv2d(8, 3, 9))

    def forward(self, x):
        y = self.down(x)
        for r in self.res:
            y = y + r(y)
        y = torch.relu(self.up2(self.up1(y)))
        return self.last(y)


class TinyLlama(nn.Module):
    """Two pre-norm decoder layers of a Llama-style model: RMSNorm, grouped-query causal attention
    over rotated queries and keys (torch.onnx.ops.rotary_embedding), a SwiGLU MLP. Exported by
    the dynamo exporter at opset 24 (OPSETS) it holds ONNX's RMSNormalization, RotaryEmbedding
    and Attention."""

    def __init__(self, vocab=300, dim=64, heads=8, kv_heads=2, layers=2, max_pos=64):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.emb = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList()
        for _ in range(layers):
            self.layers.append(nn.ModuleDict({
                "n1": nn.RMSNorm(dim, eps=1e-5), "n2": nn.RMSNorm(dim, eps=1e-5),
                "q": nn.Linear(dim, dim, bias=False),
                "k": nn.Linear(dim, kv_heads * self.hd, bias=False),
                "v": nn.Linear(dim, kv_heads * self.hd, bias=False),
                "o": nn.Linear(dim, dim, bias=False),
                "gate": nn.Linear(dim, 2 * dim, bias=False), "up": nn.Linear(dim, 2 * dim, bias=False),
                "down": nn.Linear(2 * dim, dim, bias=False)}))
        self.norm = nn.RMSNorm(dim, eps=1e-5)
        self.head = nn.Linear(dim, vocab, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, self.hd, 2).float() / self.hd))
        ang = torch.arange(max_pos).float()[:, None] * inv[None]
        self.register_buffer("cos", ang.cos())
        self.register_buffer("sin", ang.sin())

    def forward(self, ids):
        B, T = ids.shape
        pos = torch.arange(T).unsqueeze(0).expand(B, T)
        x = self.emb(ids)
        for L in self.layers:
            h = L["n1"](x)
            q = L["q"](h).view(B, T, self.heads, self.hd).transpose(1, 2)
            k = L["k"](h).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
            v = L["v"](h).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
            q = torch.onnx.ops.rotary_embedding(q, self.cos, self.sin, pos)
            k = torch.onnx.ops.rotary_embedding(k, self.cos, self.sin, pos)
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + L["o"](y.transpose(1, 2).reshape(B, T, -1))
            h = L["n2"](x)
            x = x + L["down"](nn.functional.silu(L["gate"](h)) * L["up"](h))
        return self.head(self.norm(x))


def tiny_llama():
    return TinyLlama(), (torch.randint(0, 300, (2, 11)),), ["ids"]


def tagger(cell):
    return Tagger(cell), (torch.randint(0, 500, (2, 12)),), ["ids"]


def style():
    return StyleNet(), (torch.rand(1, 3, 64, 64),), ["image"]


MODELS = {
    "resnet_small": resnet_small,
    "mobilenet_v3_small": lambda: cnn("mobilenet_v3_small"),
    "squeezenet1_1": lambda: cnn("squeezenet1_1"),
    "shufflenet_v2_x0_5": lambda: cnn("shufflenet_v2_x0_5"),
    "bert_tiny": bert,
    "gpt2_tiny": gpt2,
    "vit_tiny": vit,
    "lstm_tagger": lambda: tagger("LSTM"),
    "gru_tagger": lambda: tagger("GRU"),
    "style_transfer": style,
    "tiny_llama": tiny_llama,
}

def full_cnn(name):
    import torchvision.models as tv
    m = {"resnet50": tv.resnet50, "mobilenet_v3_large": tv.mobilenet_v3_large}[name]()
    return m, (torch.randn(1, 3, 224, 224),), ["image"]


def full_bert():
    from transformers import BertConfig, BertModel
    m = BertModel(BertConfig())
    names = ["input_ids", "attention_mask"]
    return Hidden(m, names), (torch.randint(0, 30522, (1, 128)),
                              torch.ones(1, 128, dtype=torch.int64)), names


def full_gpt2():
    from transformers import GPT2Config, GPT2Model
    m = GPT2Model(GPT2Config(use_cache=False))
    return Hidden(m, ["input_ids"]), (torch.randint(0, 50257, (1, 128)),), ["input_ids"]


FULL_MODELS = {
    "resnet50": lambda: full_cnn("resnet50"),
    "mobilenet_v3_large": lambda: full_cnn("mobilenet_v3_large"),
    "bert_base": full_bert,
    "gpt2_small": full_gpt2,
}

# the opset a model's dynamo export asks for (default: the exporter's own), and the models only the
# dynamo exporter takes
OPSETS = {"tiny_llama": 24}
DYNAMO_ONLY = {"tiny_llama"}


# the dims each model's inputs take at any size, by input name (--dynamic)
IMAGE = {0: "batch", 2: "height", 3: "width"}
TOKENS = {0: "batch", 1: "seq"}
DYNAMIC_DIMS = {
    "resnet_small": {"image": IMAGE}, "mobilenet_v3_small": {"image": IMAGE},
    "squeezenet1_1": {"image": IMAGE}, "shufflenet_v2_x0_5": {"image": IMAGE},
    "bert_tiny": {"input_ids": TOKENS, "attention_mask": TOKENS}, "gpt2_tiny": {"input_ids": TOKENS},
    "vit_tiny": {"pixel_values": {0: "batch"}}, "lstm_tagger": {"ids": TOKENS},
    "gru_tagger": {"ids": TOKENS}, "style_transfer": {"image": IMAGE}, "tiny_llama": {"ids": TOKENS},
}


# ---- export and references ----

def export(model, args, names, path, dynamo, dynamic_axes=None, opset=None):
    model.eval()
    kw = dict(input_names=names, do_constant_folding=True)
    if dynamic_axes:
        kw["dynamic_axes"] = dynamic_axes
    if dynamo:
        if opset:
            kw["opset_version"] = opset
        torch.onnx.export(model, args, path, dynamo=True, external_data=False, **kw)
    else:
        torch.onnx.export(model, args, path, dynamo=False, opset_version=17, **kw)


def write_case(path, args, names):
    case = os.path.dirname(path)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = {}
    for i, inp in enumerate(sess.get_inputs()):  # an exporter may drop an unused input
        feeds[inp.name] = args[names.index(inp.name) if inp.name in names else i].numpy()
    outs = sess.run(None, feeds)
    data = os.path.join(case, "test_data_set_0")
    os.makedirs(data, exist_ok=True)
    for i, inp in enumerate(sess.get_inputs()):
        t = numpy_helper.from_array(feeds[inp.name], inp.name)
        open(os.path.join(data, f"input_{i}.pb"), "wb").write(t.SerializeToString())
    for i, (o, v) in enumerate(zip(sess.get_outputs(), outs)):
        t = numpy_helper.from_array(v, o.name)
        open(os.path.join(data, f"output_{i}.pb"), "wb").write(t.SerializeToString())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--only", default=".*")
    ap.add_argument("--dynamic", action="store_true", help="dim_params instead of fixed shapes")
    ap.add_argument("--full", action="store_true", help="the full-size benchmark models")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    report = {}
    for name, make in (FULL_MODELS if args.full else MODELS).items():
        if not re.search(args.only, name):
            continue
        exporters = ("torchscript", "dynamo")
        if name in DYNAMO_ONLY:
            exporters = ("dynamo",)
        elif args.full:  # (GPT-2's attention mask needs aten::diff, which only dynamo exports)
            exporters = ("dynamo",) if name == "gpt2_small" else ("torchscript",)
        for exporter in exporters:
            key = f"{name}_{exporter}" + ("_dynamic" if args.dynamic else "")
            case = os.path.join(args.out, key)
            os.makedirs(case, exist_ok=True)
            path = os.path.join(case, "model.onnx")
            try:
                torch.manual_seed(0)
                model, inputs, names = make()
                with torch.no_grad():
                    dims = DYNAMIC_DIMS.get(name) if args.dynamic else None
                    export(model, inputs, names, path, exporter == "dynamo", dims,
                           OPSETS.get(name))
                m = onnx.load(path)
                if not args.dynamic:
                    write_case(path, inputs, names)
                opset = [o.version for o in m.opset_import if o.domain in ("", "ai.onnx")][0]
                report[key] = {"ok": True, "opset": opset, "mb": round(os.path.getsize(path) / 2**20, 2),
                               "ops": sorted({n.op_type for n in m.graph.node})}
            except Exception as e:  # report and go on: one exporter's failure is data too
                report[key] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:400]}
                traceback.print_exc(limit=2)
            print(key, json.dumps(report[key])[:300], flush=True)
    json.dump(report, open(os.path.join(args.out, "report.json"), "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
