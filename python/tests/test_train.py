"""Gradients, optimizers and variables through the bindings."""
import numpy as np
import pytest

import kiln


def test_gradients_match_finite_differences(rng):
    x0 = rng.standard_normal((3, 4))
    w0 = rng.standard_normal((4, 2))
    g = kiln.Graph()
    x = g.placeholder([3, 4], kiln.f64, "x")
    w = g.placeholder([4, 2], kiln.f64, "w")
    y = kiln.sum(kiln.tanh(kiln.matmul(x, w)) ** 2)
    dx, dw = kiln.gradients(y, [x, w])
    exe = g.compile([y, dx, dw], device="cpu")
    _, gx, gw = (a.numpy() for a in exe.run({x: x0, w: w0}))

    def f(xv, wv):
        return float(exe.run({x: xv, w: wv})[0].numpy())

    eps = 1e-6
    for idx in [(0, 0), (2, 3), (1, 2)]:
        d = np.zeros_like(x0)
        d[idx] = eps
        assert abs((f(x0 + d, w0) - f(x0 - d, w0)) / (2 * eps) - gx[idx]) < 1e-6
    d = np.zeros_like(w0)
    d[3, 1] = eps
    assert abs((f(x0, w0 + d) - f(x0, w0 - d)) / (2 * eps) - gw[3, 1]) < 1e-6
    # with an incoming gradient
    gy = g.placeholder([3, 2], kiln.f64)
    z = kiln.matmul(x, w)
    (dxz,) = kiln.gradients(z, [x], gy)
    seed = rng.standard_normal((3, 2))
    got = g.compile([dxz], device="cpu").run({x: x0, w: w0, gy: seed})[0].numpy()
    np.testing.assert_allclose(got, seed @ w0.T, rtol=1e-12)
    with pytest.raises(kiln.UnsupportedError, match="argmax"):
        kiln.gradients(kiln.cast(kiln.argmax(z, 1), kiln.f64), [x])


def sgd_reference(w, grads, lr, momentum):
    buf = None
    for gr in grads:
        buf = gr if buf is None else momentum * buf + gr
        w = w - lr * buf
    return w


@pytest.mark.parametrize("name", ["sgd", "adam", "adamw", "rmsprop"])
def test_optimizers_follow_pytorch_formulas(rng, name):
    w0 = rng.standard_normal(5).astype(np.float32)
    target = rng.standard_normal(5).astype(np.float32)
    g = kiln.Graph()
    w = g.variable(w0, "w")
    t = g.constant(target)
    loss = kiln.sum((w - t) * (w - t))
    (grad,) = kiln.gradients(loss, [w])
    lr = g.placeholder([], kiln.f32, "lr")
    kwargs = {"sgd": dict(momentum=0.9), "adam": {}, "adamw": dict(weight_decay=0.1),
              "rmsprop": {}}[name]
    step = getattr(kiln.optim, name)(g, [w], [grad], lr=lr, **kwargs)
    exe = g.compile([loss], updates=step, device="cpu")
    ref, m, v, buf, sq = w0.astype(np.float64), 0, 0, None, 0
    for i in range(1, 4):
        exe.run({lr: np.float32(0.05)})
        gr = 2 * (ref - target)
        if name == "sgd":
            buf = gr if buf is None else 0.9 * buf + gr
            ref = ref - 0.05 * buf
        elif name in ("adam", "adamw"):
            if name == "adamw":
                ref = ref * (1 - 0.05 * 0.1)
            m = 0.9 * m + 0.1 * gr
            v = 0.999 * v + 0.001 * gr * gr
            ref = ref - 0.05 * (m / (1 - 0.9**i)) / (np.sqrt(v / (1 - 0.999**i)) + 1e-8)
        else:
            sq = 0.99 * sq + 0.01 * gr * gr
            ref = ref - 0.05 * gr / (np.sqrt(sq) + 1e-8)
    np.testing.assert_allclose(g.read_variable(w).numpy(), ref, rtol=2e-5, atol=2e-6)


def test_variables_checkpoints_and_apply_if(rng, tmp_path):
    g = kiln.Graph()
    w = g.variable(np.zeros(3, np.float32), "w")
    b = g.variable(np.ones(2, np.float32))
    assert [v.name for v in g.variables()] == ["w", b.name] and g.num_nodes >= 2
    new = rng.standard_normal(3).astype(np.float32)
    g.write_variable(w, new)
    np.testing.assert_array_equal(g.read_variable(w).numpy(), new)
    g.save_variables(str(tmp_path / "ck"))
    g.write_variable(w, np.zeros(3, np.float32))
    g.load_variables(str(tmp_path / "ck"))
    np.testing.assert_array_equal(g.read_variable(w).numpy(), new)
    with pytest.raises(kiln.ShapeError):
        g.write_variable(w, np.zeros(4, np.float32))
    cond = g.placeholder([], kiln.bool_, "cond")
    upd = kiln.optim.apply_if(cond, [kiln.assign(w, w + 1)])
    exe = g.compile([], updates=upd, device="cpu")
    exe.run({cond: np.bool_(False)})
    np.testing.assert_array_equal(g.read_variable(w).numpy(), new)
    exe.run({cond: np.bool_(True)})
    np.testing.assert_allclose(g.read_variable(w).numpy(), new + 1)
    assert "variable" in g.dump()


def test_loss_scaling_skips_non_finite_steps():
    g = kiln.Graph()
    w = g.variable(np.ones(2, np.float32), "w")
    x = g.placeholder([2], kiln.f32, "x")
    loss = kiln.sum(w * x)
    ls = kiln.optim.scale_loss_and_step(g, loss, [w], lambda gr, vs, gs: kiln.optim.sgd(gr, vs, gs, lr=0.5),
                                        initial=8.0, growth_interval=100)
    assert isinstance(ls, kiln.optim.LossScaled) and len(ls.grads) == 1
    exe = g.compile([ls.finite, ls.scale], updates=ls.updates, device="cpu")
    fin, _ = exe.run({x: np.array([1, 2], np.float32)})
    assert bool(fin.item())
    np.testing.assert_allclose(g.read_variable(w).numpy(), [0.5, 0.0])
    fin, _ = exe.run({x: np.array([np.inf, 1], np.float32)})
    assert not bool(fin.item())
    np.testing.assert_allclose(g.read_variable(w).numpy(), [0.5, 0.0])
    assert g.read_variable(ls.scale).item() == 4.0 and g.read_variable(ls.good_steps).item() == 0


def test_batch_norm_training_updates_running_statistics(rng):
    x0 = rng.standard_normal((8, 3, 4)).astype(np.float32)
    g = kiln.Graph()
    x = g.placeholder([8, 3, 4], kiln.f32)
    rm, rv = g.variable(np.zeros(3, np.float32), "rm"), g.variable(np.ones(3, np.float32), "rv")
    y, updates = kiln.batch_norm_training(x, rm, rv, momentum=0.1)
    g.compile([y], updates=updates, device="cpu").run({x: x0})
    # against float64; a channel's mean can sit near zero, where an f32 sum of 32 values of size 1
    # is off by ~1e-7 absolute however small the mean: an absolute bound beside the relative one
    x64 = x0.astype(np.float64)
    np.testing.assert_allclose(g.read_variable(rm).numpy(), 0.1 * x64.mean((0, 2)), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(g.read_variable(rv).numpy(), 0.9 + 0.1 * x64.var((0, 2), ddof=1), rtol=1e-5)


def test_assign_slice_appends_tokens_to_a_cache_in_place(rng):
    cache0 = rng.standard_normal((12, 2, 4)).astype(np.float32)
    g = kiln.Graph()
    cache = g.variable(cache0, "kv")
    new = g.placeholder([-1, 2, 4], kiln.f32, "new")
    starts = g.placeholder([3], kiln.i64, "starts")
    exe = g.compile([], updates=[kiln.assign_slice(cache, new, starts)], device="cpu")
    want = cache0.copy()
    at = 0
    for n in (1, 4, 2):
        rows = rng.standard_normal((n, 2, 4)).astype(np.float32)
        exe.run({new: rows, starts: np.array([at, 0, 0], np.int64)})
        want[at:at + n] = rows
        at += n
        np.testing.assert_array_equal(g.read_variable(cache).numpy(), want)
    with pytest.raises(kiln.ValueError, match=r"variable 'kv' \(12, 2, 4\): start 11 of dim 0"):
        exe.run({new: rows, starts: np.array([11, 0, 0], np.int64)})
    np.testing.assert_array_equal(g.read_variable(cache).numpy(), want)
    # starts known when built, and the result read in the same run
    g2 = kiln.Graph()
    v = g2.variable(cache0, "v")
    x = g2.placeholder([1, 2, 4], kiln.f32, "x")
    out = g2.compile([kiln.assign_slice(v, x, [5, 0, 0])], device="cpu")
    row = rng.standard_normal((1, 2, 4)).astype(np.float32)
    want2 = cache0.copy()
    want2[5:6] = row
    np.testing.assert_array_equal(out.run({x: row})[0].numpy(), want2)
    with pytest.raises(TypeError, match=r"\[assign_slice\] starts must be a Tensor or a sequence of ints, got str"):
        kiln.assign_slice(v, x, "050")


def test_assign_scatter_nd_updates_rows_of_a_table_in_place(rng):
    table0 = rng.standard_normal((8, 3)).astype(np.float32)
    g = kiln.Graph()
    table = g.variable(table0, "table")
    idx = g.placeholder([-1, 1], kiln.i64, "idx")
    rows = g.placeholder([-1, 3], kiln.f32, "rows")
    exe = g.compile([], updates=[kiln.assign_scatter_nd(table, idx, rows, kiln.ScatterReduction.add)],
                    device="cpu")
    want = table0.astype(np.float64)
    for n in (2, 5):
        i = rng.integers(0, 8, (n, 1))
        r = rng.standard_normal((n, 3)).astype(np.float32)
        exe.run({idx: i, rows: r})
        np.add.at(want, i[:, 0], r)
        np.testing.assert_allclose(g.read_variable(table).numpy(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(kiln.ValueError, match="assign_scatter_nd"):
        exe.run({idx: np.array([[8]]), rows: np.ones((1, 3), np.float32)})
    np.testing.assert_allclose(g.read_variable(table).numpy(), want, rtol=1e-5, atol=1e-5)
