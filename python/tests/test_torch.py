"""kiln.torch: torch.compile(model, backend=kiln.torch.backend) against eager PyTorch.

Skipped where PyTorch is not installed. On the GPU machine (torch, torchvision, CUDA):
ResNet-18 and a BERT-tiny encoder forward within 1e-4 of eager f32, and one training step
(gradients, batch-norm statistics and SGD-updated weights) through the bridge.
"""
import copy

import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")
import kiln.torch as kt  # noqa: E402
from torch import nn  # noqa: E402

if torch.cuda.is_available():
    # eager PyTorch would use TF32 for convolutions; compare with exact f32
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


def devices():
    out = ["cpu"]
    if torch.cuda.is_available() and kiln.cuda_device_count() > 0:
        out.append("cuda")
    return out


def compiled(model):
    torch._dynamo.reset()
    kt.reset()
    return torch.compile(model, backend=kt.backend, dynamic=False)


def assert_ran_on_kiln(*ops):
    rep = kt.report()
    assert not rep["failed_partitions"], rep["failed_partitions"]
    for op in ops:
        assert rep["kiln_ops"].get(op, 0) > 0, (op, rep)


class TinyBert(nn.Module):
    """BERT-tiny shaped: token, position and type embeddings, 2 post-norm encoder layers with
    GELU, a tanh pooler and a classifier."""

    def __init__(self, vocab=1000, d=128, heads=2, layers=2, ff=512, max_len=64, classes=3):
        super().__init__()
        self.tok, self.pos, self.typ = nn.Embedding(vocab, d), nn.Embedding(max_len, d), nn.Embedding(2, d)
        self.norm = nn.LayerNorm(d, eps=1e-12)
        layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, activation="gelu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.pool, self.cls = nn.Linear(d, d), nn.Linear(d, classes)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        h = self.norm(self.tok(ids) + self.pos(pos)[None] + self.typ(torch.zeros_like(ids)))
        h = self.encoder(h)
        return self.cls(torch.tanh(self.pool(h[:, 0])))


def resnet18():
    tv = pytest.importorskip("torchvision")
    return tv.models.resnet18(weights=None, num_classes=10)


def check_forward(model, x, dev):
    torch.manual_seed(0)
    model = model.to(dev).eval()
    ref = model(x)
    out = compiled(copy.deepcopy(model))(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dev", devices())
def test_mlp_and_fallback_listing(dev):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4), nn.Softmax(-1)).to(dev)
    x = torch.randn(5, 8, device=dev)
    out = compiled(model)(x)
    torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-6)
    assert_ran_on_kiln("addmm.default", "relu.default")

    def with_unsupported(t):
        return torch.cumprod(t, 1) + t.relu()

    got = compiled(with_unsupported)(x)
    torch.testing.assert_close(got, with_unsupported(x))
    assert "cumprod.default" in kt.report()["fallback_ops"]


@pytest.mark.parametrize("dev", devices())
def test_resnet18_forward(dev):
    size = 224 if dev == "cuda" else 64
    x = torch.randn(2, 3, size, size, device=dev)
    check_forward(resnet18(), x, dev)
    assert_ran_on_kiln("convolution.default", "max_pool2d_with_indices.default")


@pytest.mark.parametrize("dev", devices())
def test_bert_tiny_forward(dev):
    torch.manual_seed(2)
    ids = torch.randint(0, 1000, (4, 32), device=dev)
    check_forward(TinyBert(), ids, dev)
    assert_ran_on_kiln("embedding.default", "native_layer_norm.default", "gelu.default")


def train_step(model, x, y):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    opt.step()
    return loss.detach(), grads


@pytest.mark.parametrize("dev", devices())
@pytest.mark.parametrize("name", ["resnet18", "bert_tiny"])
def test_training_step(dev, name):
    torch.manual_seed(3)
    if name == "resnet18":
        model = resnet18().to(dev)
        x = torch.randn(4, 3, 64, 64, device=dev)
    else:
        model = TinyBert().to(dev)
        x = torch.randint(0, 1000, (4, 16), device=dev)
    y = torch.randint(0, 3, (4,), device=dev)
    model.train()
    twin = copy.deepcopy(model)
    ref_loss, ref_grads = train_step(model, x, y)
    loss, grads = train_step(compiled(twin), x, y)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-4)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-3, atol=1e-4)
    for p, r in zip(twin.parameters(), model.parameters()):
        torch.testing.assert_close(p, r, rtol=1e-3, atol=1e-4)
    for b, r in zip(twin.buffers(), model.buffers()):  # batch-norm running statistics
        torch.testing.assert_close(b, r, rtol=1e-4, atol=1e-4)
    if name == "resnet18":
        assert_ran_on_kiln("convolution_backward.default", "native_batch_norm_backward.default")
    else:
        assert_ran_on_kiln("native_layer_norm_backward.default", "embedding_dense_backward.default")


def test_dlpack_feeds_share_memory_on_the_device():
    dev = devices()[-1]
    t = torch.randn(3, 4, device=dev)
    g = kiln.Graph()
    x = g.placeholder([3, 4], kiln.f32, "x")
    exe = g.compile([x * 2], device="cuda:0" if dev == "cuda" else "cpu")
    out = torch.from_dlpack(exe.run({x: t})[0])
    assert out.device.type == dev
    torch.testing.assert_close(out, t * 2)
    assert np.isfinite(out.cpu().numpy()).all()
