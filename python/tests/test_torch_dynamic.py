"""kiln.torch with torch.compile(dynamic=True): PyTorch's symbolic sizes become kiln's dynamic
dims, so each partition is compiled once and runs every size (counted), against eager PyTorch.

Skipped where PyTorch is not installed; on the GPU machine the same cases run on CUDA too.
"""
import copy

import pytest

torch = pytest.importorskip("torch")
import kiln.torch as kt  # noqa: E402
from test_torch import TinyBert, devices  # noqa: E402  (its import also turns TF32 off)
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402


class Attention(nn.Module):
    """A pre-norm transformer block written with views to (batch, length, heads, -1), so that
    the traced graph computes sizes from the batch and the length (s0 * s1 rows, arange(s1))."""

    def __init__(self, vocab=100, d=32, heads=4, max_len=64, classes=3):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff1, self.ff2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads, self.cls = heads, nn.Linear(d, classes)

    def forward(self, ids):
        b, n = ids.shape
        h = self.tok(ids) + self.pos(torch.arange(n, device=ids.device))[None]
        q, k, v = self.qkv(self.norm1(h)).chunk(3, dim=-1)

        def split(t):
            return t.view(b, n, self.heads, -1).transpose(1, 2)

        a = torch.softmax(split(q) @ split(k).transpose(-1, -2) / 8.0, dim=-1) @ split(v)
        h = h + self.out(a.transpose(1, 2).reshape(b, n, -1))
        h = h + self.ff2(F.gelu(self.ff1(self.norm2(h))))
        return self.cls(h[:, 1:].mean(dim=1) + h[:, 0])


def cnn():
    """Strided and dilated convolutions, batch norm, max, average and adaptive pooling: every
    size of the batch and of the image is dynamic."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.MaxPool2d(3, stride=2, padding=1), nn.Conv2d(8, 8, 3, padding=2, dilation=2), nn.ReLU(),
        nn.AvgPool2d(2, ceil_mode=True), nn.Conv2d(8, 16, 1), nn.AdaptiveAvgPool2d((2, 1)),
        nn.Flatten(), nn.Linear(32, 4))


def compile_counted(model):
    """torch.compile(dynamic=True) through kiln, with a list that grows by one per graph
    PyTorch hands the backend."""
    torch._dynamo.reset()
    kt.reset()
    calls = []

    def backend(gm, example_inputs):
        calls.append(len(gm.graph.nodes))
        return kt.backend(gm, example_inputs)

    return torch.compile(model, backend=backend, dynamic=True), calls


def assert_dynamic_on_kiln():
    rep = kt.report()
    assert not rep["failed_partitions"], rep["failed_partitions"]
    assert not rep["dynamic_fallbacks"], rep["dynamic_fallbacks"]
    assert not rep["fallback_ops"], rep["fallback_ops"]
    assert rep["kiln_compiles"] == rep["dynamic_compiles"] > 0, rep
    return rep


@pytest.mark.parametrize("dev", devices())
def test_inference_compiles_once_for_every_batch_and_length(dev):
    torch.manual_seed(4)
    model = Attention().to(dev).eval()
    fast, calls = compile_counted(copy.deepcopy(model))
    traced = []
    for b, n in ((3, 17), (5, 9), (2, 30)):
        ids = torch.randint(0, 100, (b, n), device=dev)
        with torch.no_grad():
            torch.testing.assert_close(fast(ids), model(ids), rtol=1e-4, atol=1e-5)
        traced.append(len(calls))
    rep = assert_dynamic_on_kiln()
    # PyTorch traces at the first call only (it may hand over a graph and trace again before
    # running one); kiln compiles the graph that runs, once
    assert traced[0] == traced[-1] and rep["kiln_compiles"] == 1, (traced, rep)
    for op in ("view.default", "bmm.default", "arange.default", "operator.mul"):
        assert rep["kiln_ops"].get(op, 0) > 0, (op, rep["kiln_ops"])


def train_steps(model, batches, seen=None):
    """Per batch: the loss, the gradients and the weights after an SGD step with momentum
    (seen, a list: gets kiln's compile count after each step)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    out = []
    for x, y in batches:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        grads = [p.grad.detach().clone() for p in model.parameters()]
        opt.step()
        out.append((loss.detach(), grads, [p.detach().clone() for p in model.parameters()]))
        if seen is not None:
            seen.append(kt.report()["kiln_compiles"])
    return out


def assert_same_training(got, want):
    for (loss, grads, weights), (rloss, rgrads, rweights) in zip(got, want):
        torch.testing.assert_close(loss, rloss, rtol=1e-4, atol=1e-5)
        for g, r in zip(grads, rgrads):
            torch.testing.assert_close(g, r, rtol=1e-3, atol=1e-5)
        for w, r in zip(weights, rweights):
            torch.testing.assert_close(w, r, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("dev", devices())
def test_training_with_varying_batch_and_length_compiles_once(dev):
    torch.manual_seed(5)
    model = Attention().to(dev).train()
    twin = copy.deepcopy(model)
    batches = [(torch.randint(0, 100, (b, n), device=dev), torch.randint(0, 3, (b,), device=dev))
               for b, n in ((4, 12), (6, 7), (3, 21))]
    want = train_steps(model, batches)
    fast, calls = compile_counted(twin)
    seen = []
    assert_same_training(train_steps(fast, batches, seen), want)
    rep = assert_dynamic_on_kiln()
    # the forward and the backward each compiled once by kiln, at the first batch
    assert seen == [2, 2, 2], (calls, seen, rep)
    assert rep["kiln_ops"].get("native_layer_norm_backward.default", 0) > 0


@pytest.mark.parametrize("dev", devices())
def test_cnn_training_over_batch_and_image_sizes(dev):
    torch.manual_seed(6)
    model = cnn().to(dev).train()
    twin = copy.deepcopy(model)
    # odd and even image sizes: a stride-2 convolution's input gradient crops at run time
    batches = [(torch.randn(b, 3, h, w, device=dev), torch.randint(0, 4, (b,), device=dev))
               for b, h, w in ((3, 12, 12), (5, 11, 11), (7, 10, 15), (2, 17, 8))]
    want = train_steps(model, batches + batches)
    fast, calls = compile_counted(twin)
    seen = []
    assert_same_training(train_steps(fast, batches + batches, seen), want)
    rep = assert_dynamic_on_kiln()
    # PyTorch traces again for sizes its pooling shape rules guard on (the parity of a size, the
    # batch once it changes); kiln compiles each graph it runs once, forward and backward, for
    # every size that graph takes (the second pass over the batches compiles nothing)
    assert seen[len(batches) - 1] == seen[-1] <= 2 * len(calls), (calls, seen, rep)
    for b, r in zip(twin.buffers(), model.buffers()):  # running statistics
        torch.testing.assert_close(b, r, rtol=1e-4, atol=1e-5)
    for op in ("convolution_backward.default", "max_pool2d_with_indices_backward.default",
               "avg_pool2d_backward.default", "_adaptive_avg_pool2d_backward.default"):
        assert rep["kiln_ops"].get(op, 0) > 0, (op, rep["kiln_ops"])


@pytest.mark.parametrize("dev", devices())
def test_sizes_kiln_cannot_express_compile_per_shape(dev):
    def halves(x):  # a split into pieces whose size is known only at run time
        a, b = torch.split(x, x.shape[1] // 2, dim=1)
        return a * 2 + b

    fast, calls = compile_counted(halves)
    shapes = ((3, 8), (5, 12), (2, 6))
    for shape in shapes:
        x = torch.randn(*shape, device=dev)
        torch.testing.assert_close(fast(x), halves(x))
    rep = kt.report()
    assert not rep["failed_partitions"], rep["failed_partitions"]
    assert any("split" in why for why in rep["dynamic_fallbacks"]), rep
    assert rep["kiln_compiles"] >= 1 and rep["dynamic_compiles"] == 0, rep


@pytest.mark.parametrize("dev", devices())
def test_resnet18_inference_over_batch_and_image_sizes(dev):
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(7)
    model = tv.models.resnet18(weights=None, num_classes=10).to(dev).eval()
    fast, calls = compile_counted(copy.deepcopy(model))
    for b, h, w in ((2, 64, 64), (3, 64, 64), (5, 96, 96), (4, 80, 80)):
        x = torch.randn(b, 3, h, w, device=dev)
        with torch.no_grad():
            torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-4)
    rep = assert_dynamic_on_kiln()
    assert rep["kiln_compiles"] == 1, (calls, rep)


@pytest.mark.parametrize("dev", devices())
def test_bert_tiny_training_over_batch_and_length(dev):
    torch.manual_seed(8)
    model = TinyBert().to(dev).train()
    twin = copy.deepcopy(model)
    batches = [(torch.randint(0, 1000, (b, n), device=dev), torch.randint(0, 3, (b,), device=dev))
               for b, n in ((4, 16), (6, 9), (3, 21))]
    want = train_steps(model, batches)
    fast, calls = compile_counted(twin)
    seen = []
    assert_same_training(train_steps(fast, batches, seen), want)
    assert_dynamic_on_kiln()
    assert seen == [2, 2, 2], (calls, seen)


@pytest.mark.parametrize("dev", devices())
def test_transformers_bert_inference_compiles_once(dev):
    tf = pytest.importorskip("transformers")
    torch.manual_seed(9)
    cfg = tf.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, vocab_size=500)
    cfg._attn_implementation = "sdpa"
    model = tf.BertModel(cfg, add_pooling_layer=False).to(dev).eval()
    fast, calls = compile_counted(copy.deepcopy(model))
    for b, n in ((2, 16), (3, 21), (5, 9)):
        ids = torch.randint(0, 500, (b, n), device=dev)
        mask = (torch.rand(b, n, device=dev) > 0.2).long()
        mask[:, 0] = 1
        with torch.no_grad():
            torch.testing.assert_close(fast(input_ids=ids, attention_mask=mask).last_hidden_state,
                                       model(input_ids=ids, attention_mask=mask).last_hidden_state,
                                       rtol=1e-4, atol=1e-4)
    rep = assert_dynamic_on_kiln()  # the attention mask's indexing included
    assert rep["kiln_compiles"] == 1, (calls, rep)
