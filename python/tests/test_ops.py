"""Ops through the bindings against numpy references on fresh random data."""
import math

import numpy as np
import pytest

import kiln
from helpers import run

ERF = np.vectorize(math.erf)

UNARY = {
    "neg": np.negative, "abs": np.abs, "sign": np.sign, "exp": np.exp, "log": np.log,
    "log1p": np.log1p, "expm1": np.expm1, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
    "reciprocal": lambda x: 1 / x, "sin": np.sin, "cos": np.cos, "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "relu": lambda x: np.maximum(x, 0),
    "selu": lambda x: 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * (np.exp(x) - 1)),
    "silu": lambda x: x / (1 + np.exp(-x)), "mish": lambda x: x * np.tanh(np.log1p(np.exp(x))),
    "hardswish": lambda x: x * np.clip(x + 3, 0, 6) / 6,
    "erf": ERF, "floor": np.floor, "ceil": np.ceil, "round": np.round, "tan": np.tan,
    "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh,
    "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
    "isnan": np.isnan, "isinf": np.isinf,
}
DOMAIN = {"log": (0.1, 3), "log1p": (0.1, 3), "sqrt": (0.1, 3), "rsqrt": (0.1, 3),
          "reciprocal": (0.5, 3), "asin": (-0.9, 0.9), "acos": (-0.9, 0.9), "atanh": (-0.9, 0.9),
          "acosh": (1.1, 3)}


@pytest.mark.parametrize("name", list(UNARY))
def test_unary(rng, name):
    lo, hi = DOMAIN.get(name, (-3, 3))
    x = rng.uniform(lo, hi, (4, 5))
    np.testing.assert_allclose(run(getattr(kiln, name), x), UNARY[name](x), rtol=1e-12, atol=1e-12)


BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "pow": np.power,
    "maximum": np.maximum, "minimum": np.minimum, "mod": np.mod, "equal": np.equal,
    "not_equal": np.not_equal, "less": np.less, "less_equal": np.less_equal,
    "greater": np.greater, "greater_equal": np.greater_equal,
}


@pytest.mark.parametrize("name", list(BINARY))
def test_binary_broadcasts(rng, name):
    a = rng.uniform(0.5, 2, (3, 1, 4))
    b = rng.uniform(0.5, 2, (5, 1))
    np.testing.assert_allclose(run(getattr(kiln, name), a, b), BINARY[name](a, b), rtol=1e-12)


def test_logical_bitwise_and_selection(rng):
    a, b = rng.integers(0, 2, (6,)).astype(bool), rng.integers(0, 2, (6,)).astype(bool)
    for name, ref in {"logical_and": np.logical_and, "logical_or": np.logical_or,
                      "logical_xor": np.logical_xor}.items():
        np.testing.assert_array_equal(run(getattr(kiln, name), a, b), ref(a, b))
    np.testing.assert_array_equal(run(kiln.logical_not, a), ~a)
    i, j = rng.integers(0, 100, (5,), dtype=np.int32), rng.integers(0, 100, (5,), dtype=np.int32)
    for name, ref in {"bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or,
                      "bitwise_xor": np.bitwise_xor}.items():
        np.testing.assert_array_equal(run(getattr(kiln, name), i, j), ref(i, j))
    np.testing.assert_array_equal(run(kiln.bitwise_not, i), ~i)
    s = rng.integers(0, 5, (5,), dtype=np.int32)
    np.testing.assert_array_equal(run(lambda x, y: kiln.bit_shift(x, y, True), i, s), i << s)
    x, y = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    np.testing.assert_array_equal(run(lambda c, p, q: kiln.where(c, p, q), x > 0, x, y),
                                  np.where(x > 0, x, y))
    np.testing.assert_array_equal(run(lambda p: kiln.cast(p, kiln.i32), x * 10),
                                  (x * 10).astype(np.int32))
    # the same bytes as another dtype, as numpy's view
    np.testing.assert_array_equal(run(lambda p: kiln.bitcast(p, kiln.i64), x), x.view(np.int64))
    np.testing.assert_array_equal(run(lambda p: kiln.clip(p, -0.5, 0.5), x), np.clip(x, -0.5, 0.5))
    np.testing.assert_array_equal(run(lambda p, m: kiln.masked_fill(p, m, 7.0), x, x > 0),
                                  np.where(x > 0, 7.0, x))


def test_parametric_activations(rng):
    x = rng.standard_normal((3, 7))
    close = np.testing.assert_allclose
    close(run(lambda t: kiln.leaky_relu(t, 0.2), x), np.where(x > 0, x, 0.2 * x))
    close(run(lambda t: kiln.elu(t, 0.5), x), np.where(x > 0, x, 0.5 * (np.exp(x) - 1)))
    close(run(kiln.gelu, x), 0.5 * x * (1 + ERF(x / math.sqrt(2))), rtol=1e-7)
    tanh_ref = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    close(run(lambda t: kiln.gelu(t, kiln.GeluApprox.tanh), x), tanh_ref, rtol=1e-7)
    close(run(kiln.softplus, x), np.log1p(np.exp(x)), rtol=1e-7)
    close(run(kiln.softshrink, x), np.where(x > 0.5, x - 0.5, np.where(x < -0.5, x + 0.5, 0)))
    close(run(kiln.hardshrink, x), np.where(np.abs(x) > 0.5, x, 0))
    close(run(kiln.hardsigmoid, x), np.clip(x / 6 + 0.5, 0, 1))


@pytest.mark.parametrize("name,ref", [("sum", np.sum), ("mean", np.mean), ("max", np.max),
                                      ("min", np.min), ("prod", np.prod)])
def test_reductions(rng, name, ref):
    x = rng.uniform(0.5, 1.5, (3, 4, 5))
    fn = getattr(kiln, name)
    np.testing.assert_allclose(run(lambda t: fn(t, [1], True), x), ref(x, 1, keepdims=True))
    np.testing.assert_allclose(run(fn, x), ref(x))


def test_more_reductions(rng):
    x = rng.standard_normal((4, 6))
    close = np.testing.assert_allclose
    close(run(lambda t: kiln.logsumexp(t, [1]), x), np.log(np.exp(x).sum(1)))
    close(run(lambda t: kiln.variance(t, [0], False, 1), x), x.var(0, ddof=1))
    close(run(lambda t: kiln.norm_l1(t, [1]), x), np.abs(x).sum(1))
    close(run(lambda t: kiln.norm_l2(t, [1]), x), np.sqrt((x * x).sum(1)))
    np.testing.assert_array_equal(run(lambda t: kiln.argmax(t, 1), x), x.argmax(1))
    np.testing.assert_array_equal(run(lambda t: kiln.argmin(t, 0), x), x.argmin(0))
    close(run(lambda t: kiln.cumsum(t, 1), x), np.cumsum(x, 1))


def test_transforms(rng):
    x = rng.standard_normal((2, 3, 4))
    eq = np.testing.assert_array_equal
    eq(run(lambda t: kiln.reshape(t, [4, -1]), x), x.reshape(4, -1))
    eq(run(lambda t: kiln.transpose(t), x), x.transpose())
    eq(run(lambda t: kiln.permute(t, [1, 0, 2]), x), x.transpose(1, 0, 2))
    eq(run(lambda t: kiln.expand_dims(t, [0]), x), x[None])
    eq(run(lambda t: kiln.squeeze(kiln.expand_dims(t, [1])), x), x)
    a, b = run(lambda t: kiln.split(t, 2, 2), x)
    eq(a, x[:, :, :2]) and eq(b, x[:, :, 2:])
    parts = run(lambda t: kiln.split(t, [1, 3], 2), x)
    eq(parts[1], x[:, :, 1:])
    eq(run(lambda t, u: kiln.stack([t, u], 1), x, x), np.stack([x, x], 1))
    eq(run(lambda t, u: kiln.concat([t, u], 2), x, x), np.concatenate([x, x], 2))
    eq(run(lambda t: kiln.slice(t, [1], [None or 4], [2], [2]), x), x[:, :, 1:4:2])
    eq(run(lambda t: t[1, :, ::2], x), x[1, :, ::2])
    eq(run(lambda t: t[-1], x), x[-1])
    eq(run(lambda t: kiln.pad(t, [0, 0, 1, 1, 0, 2]), x), np.pad(x, [(0, 0), (1, 1), (0, 2)]))
    eq(run(lambda t: kiln.pad(t, [0, 0, 1, 1, 2, 2], kiln.PadKind.reflect), x),
       np.pad(x, [(0, 0), (1, 1), (2, 2)], mode="reflect"))
    eq(run(lambda t: kiln.pad(t, [0, 0, 1, 1, 2, 2], kiln.PadKind.edge), x),
       np.pad(x, [(0, 0), (1, 1), (2, 2)], mode="edge"))
    eq(run(lambda t: kiln.tile(t, [1, 2, 1]), x), np.tile(x, [1, 2, 1]))
    eq(run(lambda t: kiln.broadcast_to(t, [5, 2, 3, 4]), x), np.broadcast_to(x, (5, 2, 3, 4)))
    eq(run(lambda t: kiln.flip(t, [2]), x), x[:, :, ::-1])
    eq(run(lambda t: kiln.roll(t, [1], [2]), x), np.roll(x, 1, 2))
    idx = rng.integers(0, 4, (5,))
    eq(run(lambda t, i: kiln.gather(t, i, 2), x, idx), np.take(x, idx, 2))
    ie = rng.integers(0, 3, (2, 3, 4))
    eq(run(lambda t, i: kiln.gather_elements(t, i, 1), x, ie), np.take_along_axis(x, ie, 1))
    upd = rng.standard_normal((2, 3, 4))
    ref = x.copy()
    np.put_along_axis(ref, ie[:, :1], upd[:, :1], 1)
    eq(run(lambda t, i, u: kiln.scatter_elements(t, i, u, 1), x, ie[:, :1], upd[:, :1]), ref)
    ind = np.array([[0, 1], [1, 2]])
    eq(run(lambda t, i: kiln.gather_nd(t, i), x, ind), x[[0, 1], [1, 2]])
    ref = x.copy()
    ref[[0, 1], [1, 2]] = upd[0, :2]
    eq(run(lambda t, i, u: kiln.scatter_nd(t, i, u), x, ind, upd[0, :2]), ref)
    eq(run(lambda i: kiln.one_hot(i, 4), idx), np.eye(4, dtype=np.float32)[idx])
    v, i = run(lambda t: kiln.topk(t, 2), x)
    eq(v, -np.sort(-x, 2)[:, :, :2]) and eq(i, np.argsort(-x, 2, kind="stable")[:, :, :2])
    eq(run(lambda t: kiln.sort(t, 1), x), np.sort(x, 1))
    eq(run(lambda t: kiln.argsort(t, 1), x), np.argsort(x, 1, kind="stable"))
    eq(run(lambda t: kiln.coordinate_along_axis(t, 2), x), np.broadcast_to(np.arange(4), x.shape))
    bits = rng.integers(0, 2**30, (3, 4), dtype=np.int64)
    ham = np.array([[bin(int(p) ^ int(q)).count("1") for p, q in zip(r, bits[0])] for r in bits]).sum(1)
    eq(run(lambda t, u: kiln.hamming_distance(t, u), bits, bits[:1]), ham)
    img = rng.standard_normal((1, 8, 2, 3))
    d2s = run(lambda t: kiln.depth_to_space(t, 2, crd=True), img)
    eq(d2s, run(lambda t: kiln.pixel_shuffle(t, 2), img))
    eq(run(lambda t: kiln.space_to_depth(kiln.depth_to_space(t, 2), 2), img), img)
    eq(run(lambda t: kiln.pixel_unshuffle(kiln.pixel_shuffle(t, 2), 2), img), img)
    eq(run(lambda t: kiln.resize(t, [1, 8, 4, 6]), img), img.repeat(2, 2).repeat(2, 3))
    assert run(lambda t: kiln.resize(t, [1, 8, 4, 6], kiln.ResizeMode.linear,
                                     kiln.ResizeCoordinates.half_pixel,
                                     kiln.NearestMode.floor), img).shape == (1, 8, 4, 6)
    for mode in (kiln.ResizeMode.cubic,):
        assert run(lambda t: kiln.resize(t, [1, 8, 4, 6], mode, cubic_coeff_a=-0.5,
                                         exclude_outside=True), img).shape == (1, 8, 4, 6)
    # a crop far outside the input gives the extrapolation value everywhere
    crop = run(lambda t: kiln.resize(t, [1, 8, 2, 2], kiln.ResizeMode.linear,
                                     kiln.ResizeCoordinates.tf_crop_and_resize,
                                     extrapolation_value=7.0,
                                     roi=[0, 0, 5, 5, 1, 1, 6, 6]), img)
    np.testing.assert_array_equal(crop, np.full((1, 8, 2, 2), 7.0))
    assert run(lambda t: kiln.resize(t, [1, 8, 4, 6], scales=[1, 1, 2, 2]), img).shape == (1, 8, 4, 6)
    for c in (kiln.ResizeCoordinates.align_corners, kiln.ResizeCoordinates.asymmetric,
              kiln.ResizeCoordinates.pytorch_half_pixel, kiln.ResizeCoordinates.half_pixel_symmetric,
              kiln.ResizeCoordinates.tf_crop_and_resize):
        assert c.name
    for n in (kiln.NearestMode.round_prefer_ceil, kiln.NearestMode.ceil,
              kiln.NearestMode.round_prefer_floor):
        assert n.name


def test_constants_and_generated(rng):
    g = kiln.Graph()
    c = g.constant(np.arange(3, dtype=np.float32), "c")
    outs = [kiln.full(g, [2], 3.0), kiln.zeros(g, [2], kiln.i32), kiln.ones(g, [2]),
            kiln.arange(g, 0, 5, 2), kiln.constant(g, np.ones(2)), g.scalar(4.0),
            kiln.scalar_like(c, 2.0), kiln.zeros_like(c), kiln.ones_like(c),
            kiln.sum_to_shape(kiln.broadcast_to(c, [4, 3]), [3]), c + 1, 2 * c, c - 1, 1 - c,
            c / 2, 1 / (c + 1), -c, c ** 2, 2 ** c, c % 2, c @ c, c < 1, c <= 1, c > 1, c >= 1]
    exe = g.compile(outs, device="cpu")
    r = [a.numpy() for a in exe.run()]
    cv = np.arange(3, dtype=np.float32)
    want = [[3, 3], [0, 0], [1, 1], [0, 2, 4], [1, 1], 4, 2, [0, 0, 0], [1, 1, 1], cv * 4, cv + 1,
            2 * cv, cv - 1, 1 - cv, cv / 2, 1 / (cv + 1), -cv, cv**2, 2**cv, cv % 2, cv @ cv,
            cv < 1, cv <= 1, cv > 1, cv >= 1]
    for got, w in zip(r, want):
        np.testing.assert_allclose(got, w, rtol=1e-6)
    assert c.name == "c" and c.op_name == "constant" and c.shape == (3,) and c.dtype == kiln.f32
    assert c.ndim == 1 and c.dim(-1) == 3 and c.output_index == 0 and c.node_id >= 0
    assert "constant" in repr(c) and c == c and c != outs[0] and len({c, c}) == 1


def conv2d_ref(x, w, b, stride, pad):
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, [(0, 0), (0, 0), (pad, pad), (pad, pad)])
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    y = np.zeros((n, o, oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i * stride:i * stride + kh, j * stride:j * stride + kw]
            y[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w)
    return y + b[None, :, None, None]


def test_matmul_linear_conv(rng):
    a, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 5))
    np.testing.assert_allclose(run(kiln.matmul, a, b), a @ b, rtol=1e-12)
    w, bias = rng.standard_normal((6, 4)), rng.standard_normal(6)
    np.testing.assert_allclose(run(kiln.linear, a, w, bias), a @ w.T + bias, rtol=1e-12)
    x, cw, cb = rng.standard_normal((2, 3, 7, 6)), rng.standard_normal((4, 3, 3, 3)), rng.standard_normal(4)
    np.testing.assert_allclose(run(lambda p, q, r: kiln.conv2d(p, q, r, [2, 2], [1, 1]), x, cw, cb),
                               conv2d_ref(x, cw, cb, 2, 1), rtol=1e-10)
    x1, w1 = rng.standard_normal((1, 2, 9)), rng.standard_normal((3, 2, 3))
    ref1 = conv2d_ref(x1[:, :, None], w1[:, :, None], np.zeros(3), 1, 0)[:, :, 0]
    np.testing.assert_allclose(run(kiln.conv1d, x1, w1), ref1[:, :, :], rtol=1e-10)
    x3, w3 = rng.standard_normal((1, 2, 3, 4, 4)), rng.standard_normal((2, 2, 1, 3, 3))
    assert run(kiln.conv3d, x3, w3).shape == (1, 2, 3, 2, 2)
    assert run(lambda p, q: kiln.conv2d(p, q, pad_mode=kiln.PadMode.same_upper), x, cw).shape == (2, 4, 7, 6)
    for m in (kiln.PadMode.same_lower, kiln.PadMode.valid, kiln.PadMode.explicit):
        assert run(lambda p, q: kiln.conv2d(p, q, pad_mode=m), x, cw).shape[:2] == (2, 4)
    # transposed convolution is the gradient of convolution with respect to its input
    dy = rng.standard_normal((2, 4, 4, 3))
    g = kiln.Graph()
    xt, wt, dyt = (g.placeholder(list(v.shape), kiln.f64) for v in (x, cw, dy))
    y = kiln.conv2d(xt, wt, None, [2, 2], [1, 1])
    dx, dw = kiln.gradients(y, [xt, wt], dyt)
    ct = kiln.conv_transpose2d(dyt, wt, None, [2, 2], [1, 1], [0, 1])
    gw = kiln.conv_grad_weight(xt, dyt, list(cw.shape), [2, 2], [1, 1])
    r = g.compile([dx, ct, dw, gw], device="cpu").run({xt: x, wt: cw, dyt: dy})
    np.testing.assert_allclose(r[1].numpy(), r[0].numpy(), rtol=1e-10)
    np.testing.assert_allclose(r[3].numpy(), r[2].numpy(), rtol=1e-10)
    assert run(lambda p, q: kiln.conv_transpose1d(p, q), x1, rng.standard_normal((2, 3, 3))).shape == (1, 3, 11)
    assert run(lambda p, q: kiln.conv_transpose3d(p, q), x3, rng.standard_normal((2, 1, 1, 1, 1))).shape == (1, 1, 3, 4, 4)
    e = "ij,jk->ik"
    np.testing.assert_allclose(run(lambda p, q: kiln.einsum(e, [p, q]), a[0], b), np.einsum(e, a[0], b))


def test_pooling(rng):
    x = rng.standard_normal((2, 3, 6, 6))
    win = x.reshape(2, 3, 3, 2, 3, 2)
    np.testing.assert_array_equal(run(lambda t: kiln.max_pool(t, [2, 2]), x), win.max((3, 5)))
    np.testing.assert_allclose(run(lambda t: kiln.avg_pool(t, [2, 2]), x), win.mean((3, 5)))
    y, idx = run(lambda t: kiln.max_pool_with_indices(t, [2, 2]), x)
    np.testing.assert_array_equal(np.take_along_axis(x.reshape(2, 3, -1), idx.reshape(2, 3, -1), 2),
                                  y.reshape(2, 3, -1))
    np.testing.assert_allclose(run(kiln.global_avg_pool, x), x.mean((2, 3), keepdims=True))
    np.testing.assert_allclose(run(lambda t: kiln.adaptive_avg_pool(t, [3, 3]), x), win.mean((3, 5)))
    g = rng.standard_normal((2, 3, 3, 3))
    spread = np.repeat(np.repeat(g, 2, 2), 2, 3) / 4
    np.testing.assert_allclose(run(lambda t: kiln.avg_pool_grad(t, [2, 3, 6, 6], [2, 2]), g), spread)
    np.testing.assert_allclose(run(lambda t: kiln.adaptive_avg_pool_grad(t, [2, 3, 6, 6]), g), spread)
    got = run(lambda t, i: kiln.max_pool_grad(t, i, [2, 3, 6, 6]), g, idx)
    want = np.zeros((2, 3, 36))
    np.put_along_axis(want, idx.reshape(2, 3, -1), g.reshape(2, 3, -1), 2)
    np.testing.assert_allclose(got, want.reshape(x.shape))


def test_normalization(rng):
    x = rng.standard_normal((4, 3, 5))
    close = np.testing.assert_allclose
    sm = np.exp(x) / np.exp(x).sum(-1, keepdims=True)
    close(run(kiln.softmax, x), sm)
    close(run(kiln.log_softmax, x), np.log(sm))
    w, b = rng.standard_normal(5), rng.standard_normal(5)
    ln = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * w + b
    close(run(kiln.layer_norm, x, w, b), ln, rtol=1e-10)
    rms = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w
    close(run(kiln.rms_norm, x, w), rms, rtol=1e-10)
    m, v, cw, cb = rng.standard_normal(3), rng.uniform(0.5, 2, 3), rng.standard_normal(3), rng.standard_normal(3)
    bn = (x - m[:, None]) / np.sqrt(v[:, None] + 1e-5) * cw[:, None] + cb[:, None]
    close(run(kiln.batch_norm, x, m, v, cw, cb), bn, rtol=1e-10)
    y, mean, var = run(lambda t, p, q: kiln.batch_norm_train(t, p, q), x, cw, cb)
    close(mean, x.mean((0, 2)))
    close(var, x.var((0, 2)))
    close(y, (x - mean[:, None]) / np.sqrt(var[:, None] + 1e-5) * cw[:, None] + cb[:, None], rtol=1e-10)
    dy = rng.standard_normal(x.shape)
    dx, dwt, dbs = run(lambda d, t, p, q, r: kiln.batch_norm_train_grad(d, t, p, q, r),
                       dy, x, mean, var, cw)
    close(dbs, dy.sum((0, 2)))
    xhat = (x - mean[:, None]) / np.sqrt(var[:, None] + 1e-5)
    close(dwt, (dy * xhat).sum((0, 2)), rtol=1e-10)
    inorm = (x - x.mean(2, keepdims=True)) / np.sqrt(x.var(2, keepdims=True) + 1e-5)
    close(run(kiln.instance_norm, x), inorm, rtol=1e-10)
    x4 = rng.standard_normal((2, 4, 3))
    gr = x4.reshape(2, 2, 6)
    gn = ((gr - gr.mean(2, keepdims=True)) / np.sqrt(gr.var(2, keepdims=True) + 1e-5)).reshape(x4.shape)
    close(run(lambda t: kiln.group_norm(t, 2), x4), gn, rtol=1e-10)
    close(run(lambda t: kiln.dropout(t, 0.5), x), x)
    kept = run(lambda t: kiln.dropout(t, 0.5, True, 7), np.ones((1000,)))
    assert set(np.unique(kept)) <= {0.0, 2.0} and 300 < (kept > 0).sum() < 700


def test_losses_and_attention(rng):
    logits, labels = rng.standard_normal((6, 4)), rng.integers(0, 4, (6,))
    lsm = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    close = np.testing.assert_allclose
    close(run(kiln.softmax_cross_entropy, logits, labels), -lsm[np.arange(6), labels].mean())
    close(run(lambda p, q: kiln.softmax_cross_entropy(p, q, kiln.Reduction.none), logits, labels),
          -lsm[np.arange(6), labels])
    close(run(lambda p, q: kiln.nll(p, q, kiln.Reduction.sum), lsm, labels), -lsm[np.arange(6), labels].sum())
    a, b = rng.standard_normal((3, 2)), rng.standard_normal((3, 2))
    close(run(kiln.mse, a, b), ((a - b) ** 2).mean())
    q, k, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 6))
    s = q @ k.transpose(0, 2, 1) / 2
    for causal in (False, True):
        sc = np.where(np.tril(np.ones((3, 5), bool)), s, -np.inf) if causal else s
        p = np.exp(sc - sc.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        close(run(lambda a_, b_, c_: kiln.scaled_dot_product_attention(a_, b_, c_, causal=causal), q, k, v),
              p @ v, rtol=1e-10)


def test_random_ops():
    g = kiln.Graph()
    st = kiln.random_philox_state(g, 1, 2)
    u, st2 = kiln.random_uniform(st, [1000], 2.0, 3.0)
    n, _ = kiln.random_normal(st2, [2000], 1.0, 2.0, kiln.f64)
    i, _ = kiln.random_integer(st, [100], 5, 9)
    bern, _ = kiln.random_bernoulli(st, [1000], 0.25)
    su = kiln.stateless_uniform(g, [10], [3, 4])
    sn = kiln.stateless_normal(g, [10], [3, 4])
    r = [a.numpy() for a in g.compile([u, n, i, bern, su, sn], device="cpu").run()]
    assert r[0].min() >= 2 and r[0].max() < 3
    assert abs(r[1].mean() - 1) < 0.2 and abs(r[1].std() - 2) < 0.2
    assert r[2].min() >= 5 and r[2].max() < 9 and r[2].dtype == np.int32
    assert 150 < r[3].sum() < 350
    assert r[4].shape == (10,) and r[5].shape == (10,)


def test_recurrent_layers(rng):
    T, B, I, H = 5, 2, 3, 4
    x = rng.standard_normal((T, B, I)).astype(np.float32)
    g = kiln.Graph()
    xt = g.placeholder([T, B, I], kiln.f32)

    values = {}

    def w(*shape):
        v = rng.standard_normal(shape).astype(np.float32) * 0.3
        t = g.constant(v)
        values[t] = v
        return t

    lstm = kiln.lstm(xt, [kiln.RnnLayerWeights(w(1, 4 * H, I), w(1, 4 * H, H), w(1, 8 * H))])
    gru = kiln.gru(xt, [kiln.RnnLayerWeights(w(2, 3 * H, I), w(2, 3 * H, H))],
                   direction=kiln.RnnDirection.bidirectional, linear_before_reset=True)
    wi, wh = w(H, I), w(H, H)
    simple = kiln.rnn(xt, [kiln.RnnLayerWeights(kiln.expand_dims(wi, [0]), kiln.expand_dims(wh, [0]))])
    torch_layer = kiln.torch_rnn_weights(kiln.RnnCell.rnn, [wi], [wh])
    simple2 = kiln.rnn(xt, [torch_layer])
    outs = [lstm.y, lstm.h, lstm.c, gru.y, simple.y, simple2.y]
    r = [a.numpy() for a in g.compile(outs, device="cpu").run({xt: x})]
    assert r[0].shape == (T, B, 1, H) and r[1].shape == (1, B, H) and r[2].shape == (1, B, H)
    assert r[3].shape == (T, B, 2, H)
    # single-gate RNN against the recurrence h' = tanh(x Wiᵀ + h Whᵀ)
    h = np.zeros((B, H), np.float32)
    for step in range(T):
        h = np.tanh(x[step] @ values[wi].T + h @ values[wh].T)
        np.testing.assert_allclose(r[4][step, :, 0], h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(r[4], r[5], rtol=1e-6)
    assert lstm.reserve == [] and gru.c is None
    # another activation, and a training node's reserve
    relu = kiln.RnnActivation(kiln.RnnActivationKind.relu)
    assert relu.kind == kiln.RnnActivationKind.relu and relu.alpha == 0 and relu.beta == 0
    lk = kiln.RnnActivation(kiln.RnnActivationKind.leaky_relu)
    assert abs(lk.alpha - 0.01) < 1e-12 and kiln.RnnActivation().kind == kiln.RnnActivationKind.tanh
    rr = kiln.rnn(xt, [torch_layer], activations=[relu], training=True)
    lt = kiln.lstm(xt, [kiln.RnnLayerWeights(w(1, 4 * H, I), w(1, 4 * H, H))], input_forget=True)
    ry, lty = (a.numpy() for a in g.compile([rr.y, lt.y], device="cpu").run({xt: x}))
    assert len(rr.reserve) == 1 and lty.shape == (T, B, 1, H)
    h = np.zeros((B, H), np.float32)
    for step in range(T):
        h = np.maximum(x[step] @ values[wi].T + h @ values[wh].T, 0)
        np.testing.assert_allclose(ry[step, :, 0], h, rtol=1e-5, atol=1e-6)
    for k in ("sigmoid", "tanh", "affine", "thresholded_relu", "scaled_tanh", "hard_sigmoid", "elu",
              "softsign", "softplus"):
        act = kiln.RnnActivation(getattr(kiln.RnnActivationKind, k), 1.0, 0.5)
        act.alpha, act.beta = act.alpha, act.beta
    assert kiln.RnnCell.lstm.name == "lstm" and kiln.RnnCell.gru.name == "gru"
    assert kiln.RnnDirection.forward != kiln.RnnDirection.reverse
    layer = kiln.RnnLayerWeights()
    layer.w, layer.r = torch_layer.w, torch_layer.r
    assert layer.b is None and layer.p is None and h.shape == (B, H)


def test_linear_algebra_extras(rng):
    a = rng.standard_normal((4, 4))
    spd = a @ a.T + 4 * np.eye(4)
    np.testing.assert_allclose(run(kiln.cholesky, spd), np.linalg.cholesky(spd), rtol=1e-10)
    L = np.linalg.cholesky(spd)
    b = rng.standard_normal((4, 2))
    np.testing.assert_allclose(run(kiln.triangular_solve, L, b), np.linalg.solve(L, b), rtol=1e-10)


def test_detection_and_embedding(rng):
    boxes = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, 2, 1, 3]]], np.float32)
    scores = np.array([[[0.9, 0.8, 0.7]]], np.float32)
    sel, count = run(lambda p, q: kiln.non_max_suppression(p, q, 3, 0.5), boxes, scores)
    assert int(count) == 2 and sel[:2].tolist() == [[0, 0, 0], [0, 0, 2]]
    wt, idx = rng.standard_normal((5, 3)), rng.integers(0, 5, (2, 4))
    np.testing.assert_array_equal(run(kiln.embedding, wt, idx), wt[idx])
    g = rng.standard_normal((2, 4, 3))
    want = np.zeros((5, 3))
    np.add.at(want, idx, g)
    np.testing.assert_allclose(run(lambda i, d: kiln.embedding_grad(i, d, 5), idx, g), want)


def test_errors_name_the_op_and_shapes():
    g = kiln.Graph()
    a, b = g.placeholder([2, 3]), g.placeholder([4])
    with pytest.raises(kiln.ShapeError, match=r"\[add\].*\(2, 3\)"):
        kiln.add(a, b)
    with pytest.raises(ValueError):  # kiln.ShapeError is a ValueError too
        kiln.matmul(a, b)
    with pytest.raises(kiln.DTypeError):
        kiln.bitwise_and(a, a)
    assert issubclass(kiln.UnsupportedError, NotImplementedError)
    assert issubclass(kiln.IoError, OSError) and issubclass(kiln.OutOfMemory, MemoryError)
    assert issubclass(kiln.FormatError, kiln.Error) and issubclass(kiln.DeviceError, kiln.Error)


def test_more_random_and_grid_sample(rng):
    g = kiln.Graph()
    st = kiln.random_philox_state_from(g, 5, 0, 9)
    tn, st2 = kiln.random_truncated_normal(st, [2000], 0.0, 1.0, -1.0, 1.0)
    mask, _ = kiln.random_dropout_mask(st2, [1000], 0.8)
    stn = kiln.stateless_truncated_normal(g, [500], [1, 2])
    r = [a.numpy() for a in g.compile([tn, mask, stn], device="cpu").run()]
    assert r[0].min() >= -1 and r[0].max() <= 1 and abs(r[0].mean()) < 0.1
    assert set(np.unique(r[1])) <= {0.0, np.float32(1 / 0.8)} and 700 < (r[1] > 0).sum() < 900
    assert np.abs(r[2]).max() < 2
    x = rng.standard_normal((1, 2, 3, 4))
    # the identity grid (align_corners) samples x back
    ys, xs = np.meshgrid(np.linspace(-1, 1, 3), np.linspace(-1, 1, 4), indexing="ij")
    grid = np.stack([xs, ys], -1)[None]
    np.testing.assert_allclose(
        run(lambda t, gr: kiln.grid_sample(t, gr, kiln.GridSampleMode.linear,
                                           kiln.GridSamplePadding.zeros, True), x, grid), x, atol=1e-12)
    for m in (kiln.GridSampleMode.nearest, kiln.GridSampleMode.cubic):
        for p in (kiln.GridSamplePadding.border, kiln.GridSamplePadding.reflection):
            assert run(lambda t, gr: kiln.grid_sample(t, gr, m, p), x, grid).shape == x.shape
