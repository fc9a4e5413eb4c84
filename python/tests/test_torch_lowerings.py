"""The ATen lowerings of kiln.torch that need no PyTorch to check: hand-written backward
formulas against kiln.gradients of the forward op, and shape ops against numpy."""
import numpy as np

import kiln
from kiln import _torch_ops as ops
from kiln._torch_sym import Sym


def lowering(name):
    return ops._LOWERINGS[name]


def evaluate(build, *inputs):
    g = kiln.Graph()
    ctx = ops._Ctx(g)
    ts = [g.placeholder(list(a.shape), kiln.dtype(a.dtype)) for a in inputs]
    out = build(ctx, *ts)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    keep = [o for o in outs if o is not None]
    res = iter(g.compile(keep, device="cpu").run(dict(zip(ts, inputs))))
    vals = [None if o is None else next(res).numpy() for o in outs]
    return vals if isinstance(out, (tuple, list)) else vals[0]


def test_layer_norm_backward_matches_kiln_gradients(rng):
    x, w, b, dy = (rng.standard_normal(s) for s in [(3, 4, 6), (6,), (6,), (3, 4, 6)])

    def build(ctx, x, w, b, dy):
        y, mean, rstd = lowering("native_layer_norm.default")(ctx, x, [6], w, b, 1e-5)
        mine = lowering("native_layer_norm_backward.default")(ctx, dy, x, [6], mean, rstd, w, b,
                                                              [True, True, True])
        return list(mine) + kiln.gradients(y, [x, w, b], dy)

    dx, dw, db, rx, rw, rb = evaluate(build, x, w, b, dy)
    np.testing.assert_allclose(dx, rx, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(dw, rw, rtol=1e-9)
    np.testing.assert_allclose(db, rb, rtol=1e-9)


def test_batch_norm_backward_both_modes(rng):
    x, w, b, dy = (rng.standard_normal(s) for s in [(4, 3, 5, 2), (3,), (3,), (4, 3, 5, 2)])
    rm, rv = rng.standard_normal(3), rng.uniform(0.5, 2, 3)

    def build(ctx, x, w, b, dy, rm, rv):
        train = lowering("_native_batch_norm_legit_functional.default")(ctx, x, w, b, rm, rv, True, 0.1, 1e-5)
        evalo = lowering("_native_batch_norm_legit_no_training.default")(ctx, x, w, b, rm, rv, 0.1, 1e-5)
        back = lowering("native_batch_norm_backward.default")
        mask = [True, True, True]
        mt = back(ctx, dy, x, w, rm, rv, train[1], train[2], True, 1e-5, mask)
        me = back(ctx, dy, x, w, rm, rv, None, None, False, 1e-5, mask)
        return (list(mt) + kiln.gradients(train[0], [x, w, b], dy) + list(me) +
                kiln.gradients(evalo[0], [x], dy) + [train[3], train[4]])

    r = evaluate(build, x, w, b, dy, rm, rv)
    for mine, ref in zip(r[0:3], r[3:6]):
        np.testing.assert_allclose(mine, ref, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(r[6], r[9], rtol=1e-10)
    xhat = (x - rm[:, None, None]) / np.sqrt(rv[:, None, None] + 1e-5)
    np.testing.assert_allclose(r[7], (dy * xhat).sum((0, 2, 3)), rtol=1e-10)
    np.testing.assert_allclose(r[8], dy.sum((0, 2, 3)), rtol=1e-10)
    n = 4 * 5 * 2
    np.testing.assert_allclose(r[10], 0.9 * rm + 0.1 * x.mean((0, 2, 3)), rtol=1e-10)
    np.testing.assert_allclose(r[11], 0.9 * rv + 0.1 * x.var((0, 2, 3)) * n / (n - 1), rtol=1e-10)


def test_softmax_backwards_and_nll(rng):
    x, g = rng.standard_normal((3, 5)), rng.standard_normal((3, 5))
    t = rng.integers(0, 5, (3,))

    def build(ctx, x, g, t):
        y = kiln.softmax(x, 1)
        ly = kiln.log_softmax(x, 1)
        loss, total = lowering("nll_loss_forward.default")(ctx, ly, t, None, 1, -100)
        one = ctx.g.scalar(1.0, kiln.f64)
        return [lowering("_softmax_backward_data.default")(ctx, g, y, 1, None),
                kiln.gradients(y, [x], g)[0],
                lowering("_log_softmax_backward_data.default")(ctx, g, ly, 1, None),
                kiln.gradients(ly, [x], g)[0],
                lowering("nll_loss_backward.default")(ctx, one, ly, t, None, 1, -100, total),
                kiln.gradients(loss, [ly])[0]]

    r = evaluate(build, x, g, t)
    for mine, ref in zip(r[0::2], r[1::2]):
        np.testing.assert_allclose(mine, ref, rtol=1e-9, atol=1e-12)


def test_shape_ops_and_their_backwards(rng):
    x = rng.standard_normal((2, 6, 4))

    def build(ctx, x):
        sel = lowering("select.int")(ctx, x, 1, -2)
        sl = lowering("slice.Tensor")(ctx, x, 1, 1, 2**62, 1)
        return [sel, sl,
                lowering("select_backward.default")(ctx, sel, [2, 6, 4], 1, -2),
                lowering("slice_backward.default")(ctx, sl, [2, 6, 4], 1, 1, 2**62, 1),
                *lowering("split.Tensor")(ctx, x, 4, 1),
                lowering("expand.default")(ctx, kiln.expand_dims(x, [0]), [3, -1, -1, -1]),
                lowering("transpose.int")(ctx, x, 0, -1),
                lowering("squeeze.dim")(ctx, kiln.expand_dims(x, [1]), 1),
                lowering("div.Tensor")(ctx, kiln.cast(x, kiln.i64), ctx.g.scalar(2, kiln.i64))]

    r = evaluate(build, x)
    np.testing.assert_array_equal(r[0], x[:, -2])
    np.testing.assert_array_equal(r[1], x[:, 1:])
    want = np.zeros_like(x)
    want[:, -2] = x[:, -2]
    np.testing.assert_array_equal(r[2], want)
    want = x.copy()
    want[:, 0] = 0
    np.testing.assert_array_equal(r[3], want)
    np.testing.assert_array_equal(r[4], x[:, :4]) and np.testing.assert_array_equal(r[5], x[:, 4:])
    assert r[6].shape == (3, 2, 6, 4)
    np.testing.assert_array_equal(r[7], x.transpose(2, 1, 0))
    np.testing.assert_array_equal(r[8], x)
    np.testing.assert_allclose(r[9], x.astype(np.int64) / 2)


def test_index_gather_and_bitwise_against_numpy(rng):
    x = rng.standard_normal((4, 5, 3))
    i0, i1 = rng.integers(-4, 4, (2, 1)), rng.integers(0, 5, (1, 3))
    one = rng.integers(0, 4, 6)
    along = rng.integers(0, 5, (4, 2, 3))
    a, b = rng.integers(0, 2, 7).astype(bool), rng.integers(0, 2, 7).astype(bool)

    def build(ctx, x, i0, i1, one, along, a, b):
        index = lowering("index.Tensor")
        return [index(ctx, x, [i0, i1]), index(ctx, x, [one]),
                lowering("gather.default")(ctx, x, 1, along),
                lowering("bitwise_and.Tensor")(ctx, a, b), lowering("bitwise_xor.Tensor")(ctx, a, b)]

    got = evaluate(build, x, i0, i1, one, along, a, b)
    np.testing.assert_array_equal(got[0], x[i0, i1])  # broadcast to (2, 3), then x's last dim
    np.testing.assert_array_equal(got[1], x[one])
    np.testing.assert_array_equal(got[2], np.take_along_axis(x, along, 1))
    np.testing.assert_array_equal(got[3], a & b)
    np.testing.assert_array_equal(got[4], a ^ b)


def test_sizes_known_at_run_time(rng):
    # what torch.compile(dynamic=True) graphs do with their SymInts, on a graph whose batch and
    # length are dynamic: views to b * n rows, arange(n), slices to n - 1, ones of (b, n)
    g = kiln.Graph()
    ctx = ops._Ctx(g)
    x = g.placeholder(["b", "n", 6], kiln.f32, "x")
    b, n = ctx.dim(x, 0), ctx.dim(x, 1)
    assert ctx.dim(x, 2) == 6 and isinstance(b, Sym) and isinstance(b * n - 1, Sym)
    rows = lowering("view.default")(ctx, x, [b * n, 6])
    heads = lowering("view.default")(ctx, x, [b, n, 2, 3])
    ctx.out_dtype = lambda: kiln.i64  # (PyTorch's dtype of the node, where it gives none)
    pos = lowering("arange.default")(ctx, n, dtype=None)
    head = lowering("slice.Tensor")(ctx, x, 1, 0, n - 1)
    ctx.out_dtype = lambda: kiln.f32
    ones = lowering("ones.default")(ctx, [b, n], dtype=None)
    last = lowering("select.int")(ctx, x, 1, -1)
    exe = g.compile([rows, heads, pos, head, ones, last], device="cpu")
    for shape in ((2, 5, 6), (3, 2, 6)):
        xv = rng.standard_normal(shape).astype(np.float32)
        got = [r.numpy() for r in exe.run({x: xv})]
        np.testing.assert_array_equal(got[0], xv.reshape(-1, 6))
        np.testing.assert_array_equal(got[1], xv.reshape(shape[0], shape[1], 2, 3))
        np.testing.assert_array_equal(got[2], np.arange(shape[1]))
        np.testing.assert_array_equal(got[3], xv[:, :-1])
        np.testing.assert_array_equal(got[4], np.ones(shape[:2]))
        np.testing.assert_array_equal(got[5], xv[:, -1])
