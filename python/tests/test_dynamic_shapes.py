"""Dynamic dims from Python: one executable for every batch size, named dims, ranges, the cache."""
import numpy as np
import pytest

import kiln


def dense(rng):
    g = kiln.Graph()
    x = g.placeholder([None, 12], kiln.f32, "x")
    w = rng.standard_normal((12, 5)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    y = kiln.relu(kiln.matmul(x, g.constant(w)) + g.constant(b))
    return g, x, w, b, y


def test_one_executable_runs_every_batch_size(rng):
    g, x, w, b, y = dense(rng)
    exe = g.compile([y])
    assert exe.is_dynamic and exe.inputs()[0].shape == [-1, 12]
    for n in (1, 9, 4, 9):
        xv = rng.standard_normal((n, 12)).astype(np.float32)
        # float64 reference; f32 sums of 12 products
        want = np.maximum(xv.astype(np.float64) @ w + b, 0)
        np.testing.assert_allclose(exe.run({x: xv})[0].numpy(), want, rtol=1e-5, atol=1e-5)
    c = exe.shape_cache()
    assert (c["misses"], c["hits"], c["entries"], c["evictions"]) == (3, 1, 3, 0)
    assert c["bytes"] <= c["max_bytes"] and "3 misses" in exe.report()
    # a feed shape at compile time gives a static executable
    assert not g.compile([y], feed_shapes={x: (3, 12)}).is_dynamic


def test_named_dims_and_ranges(rng):
    g = kiln.Graph()
    ids = g.placeholder(["batch", "seq"], kiln.f32, "ids", ranges={"batch": (1, 4), 1: (2, None)})
    mask = g.placeholder(["batch", "seq"], kiln.f32, "mask")
    exe = g.compile([ids * mask])
    a = rng.standard_normal((3, 5)).astype(np.float32)
    m = rng.standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_allclose(exe.run({ids: a, mask: m})[0].numpy(), a * m, rtol=1e-6)
    with pytest.raises(kiln.ShapeError, match=r"input 'mask' dim 1 is 'seq' = 5 \(from 'ids'\) "
                       r"but the feed has 4"):
        exe.run({ids: a, mask: m[:, :4]})
    with pytest.raises(kiln.ShapeError, match=r"dim 0 \('batch'\) must be in \[1, 4\] but the "
                       r"feed has 6"):
        exe.run({ids: np.zeros((6, 5), np.float32), mask: np.zeros((6, 5), np.float32)})
    with pytest.raises(kiln.ShapeError, match=r"dim 1 \('seq'\) must be at least 2"):
        exe.run({ids: np.zeros((2, 1), np.float32), mask: np.zeros((2, 1), np.float32)})
    with pytest.raises(ValueError, match="no dim has"):
        g.placeholder(["n"], kiln.f32, "z", ranges={"m": (1, 2)})


def test_batch_buckets_and_symbolic_passes(rng):
    g, x, w, b, _ = dense(rng)
    g = kiln.Graph()
    x = g.placeholder(["batch", 12], kiln.f32, "x", buckets={"batch": [4, 16]})
    y = kiln.relu(kiln.matmul(x, g.constant(w)) + g.constant(b))
    exe = g.compile([y])
    for n in (3, 1, 4, 9, 16, 17):
        xv = rng.standard_normal((n, 12)).astype(np.float32)
        want = np.maximum(xv.astype(np.float64) @ w + b, 0)
        got = exe.run({x: xv})[0].numpy()
        assert got.shape == (n, 5)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    c = exe.shape_cache()
    # buckets 4 and 16, and 17 at its own size; the passes ran once, on the symbolic program
    assert (c["misses"], c["hits"]) == (3, 3)
    assert c["symbolic"] and c["symbolic_misses"] == 3
    with pytest.raises(ValueError, match="no dim has"):
        g.placeholder(["n"], kiln.f32, "z", buckets={"m": [2]})
    with pytest.raises(kiln.ShapeError, match="must ascend"):
        g.placeholder([None], kiln.f32, "z", buckets={0: [4, 2]})


def test_cache_bounds(rng):
    g, x, w, b, y = dense(rng)
    opts = kiln.CompileOptions()
    opts.max_specializations = 2
    exe = g.compile([y], options=opts)
    for n in (1, 2, 3, 1):
        exe.run({x: np.ones((n, 12), np.float32)})
    c = exe.shape_cache()
    assert (c["entries"], c["evictions"], c["misses"], c["max_entries"]) == (2, 2, 4, 2)
    # a bound of bytes below one specialization keeps only the one running
    opts = kiln.CompileOptions(fuse_elementwise=False)
    opts.max_specialization_bytes = 1
    exe = g.compile([kiln.exp(kiln.exp(y))], options=opts)
    for n in (1, 2, 3):
        exe.run({x: np.ones((n, 12), np.float32)})
    c = exe.shape_cache()
    assert (c["entries"], c["evictions"], c["max_bytes"]) == (1, 2, 1) and c["bytes"] > 0


def test_training_with_a_dynamic_batch(rng):
    g = kiln.Graph()
    x = g.placeholder([None, 4], kiln.f32, "x")
    labels = g.placeholder([None], kiln.i64, "labels")
    w = g.variable(rng.standard_normal((3, 4)).astype(np.float32), "w")
    loss = kiln.softmax_cross_entropy(kiln.linear(x, w), labels)
    step = kiln.optim.sgd(g, [w], kiln.gradients(loss, [w]), lr=0.1)
    train = g.compile([loss], updates=step)
    for n in (5, 2):
        w0 = g.read_variable(w).numpy().astype(np.float64)
        xv = rng.standard_normal((n, 4)).astype(np.float32)
        lv = rng.integers(0, 3, n)
        train.run({x: xv, labels: lv})
        # float64 reference: the mean cross entropy's gradient is (softmax - one_hot)^T x / n
        z = xv.astype(np.float64) @ w0.T
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        p[np.arange(n), lv] -= 1
        want = w0 - 0.1 * (p.T @ xv) / n
        np.testing.assert_allclose(g.read_variable(w).numpy(), want, rtol=1e-5, atol=1e-6)
    assert train.shape_cache()["misses"] == 2


def test_shape_values(rng):
    """shape_of and the ops fed by values computed from it, against numpy at several shapes."""
    g = kiln.Graph()
    x = g.placeholder(["batch", "seq", 6], kiln.f32, "x")
    s = kiln.shape_of(x)
    i64 = lambda *v: g.constant(np.array(v, np.int64))  # noqa: E731
    b, l = kiln.gather(s, i64(0)), kiln.gather(s, i64(1))
    flat = kiln.reshape(x, kiln.concat([b, l * i64(6)]))
    same = kiln.reshape(flat, i64(0, -1, 6), zero_copies=True)
    pos = kiln.arange(g, 0, kiln.gather(s, g.constant(np.array(1, np.int64))), 1, kiln.i64)
    table = rng.standard_normal((10, 6)).astype(np.float32)
    sliced = kiln.slice(g.constant(table), i64(0), l, axes=[0])
    twos = kiln.expand(g.constant(np.ones((1, 1), np.float32)), kiln.concat([b, l])) * \
        kiln.full(g, kiln.concat([b, l]), 2.0)
    exe = g.compile([flat, same, pos, sliced, twos])
    assert exe.is_dynamic
    for n, t in ((2, 3), (1, 10), (2, 3)):
        xv = rng.standard_normal((n, t, 6)).astype(np.float32)
        out = [o.numpy() for o in exe.run({x: xv})]
        np.testing.assert_array_equal(out[0], xv.reshape(n, t * 6))
        np.testing.assert_array_equal(out[1], xv)
        np.testing.assert_array_equal(out[2], np.arange(t))
        np.testing.assert_array_equal(out[3], table[:t])
        np.testing.assert_array_equal(out[4], np.full((n, t), 2.0, np.float32))
    assert exe.shape_cache()["misses"] == 2


def test_pool_gradients_take_the_input_shape_at_run_time(rng):
    # max_pool_grad, avg_pool_grad and adaptive_avg_pool_grad with input_shape = shape_of(x),
    # for inputs whose spatial dims are known only at run time
    g = kiln.Graph()
    x = g.placeholder([None, 2, None, None], kiln.f32, "x")
    m, idx = kiln.max_pool_with_indices(x, [2, 2], [2, 2])
    dx_max = kiln.max_pool_grad(m, idx, kiln.shape_of(x))
    a = kiln.avg_pool(x, [2, 2], [2, 2])
    dx_avg = kiln.avg_pool_grad(a, kiln.shape_of(x), [2, 2], [2, 2])
    p = kiln.adaptive_avg_pool(x, [1, 1])
    dx_ada = kiln.adaptive_avg_pool_grad(p, kiln.shape_of(x))
    assert dx_max.shape == (-1, 2, -1, -1)
    exe = g.compile([dx_max, dx_avg, dx_ada])
    for shape in ((2, 2, 6, 8), (1, 2, 5, 7)):
        xv = rng.standard_normal(shape).astype(np.float32)
        n, c, h, w = shape
        hh, ww = h // 2 * 2, w // 2 * 2  # the windows cover these; the rest gets no gradient
        win = xv[:, :, :hh, :ww].reshape(n, c, hh // 2, 2, ww // 2, 2).astype(np.float64)
        top = win.max(axis=(3, 5), keepdims=True)
        mean = win.mean(axis=(3, 5), keepdims=True)
        want_max = np.zeros(shape)
        want_max[:, :, :hh, :ww] = np.where(win == top, top, 0).reshape(n, c, hh, ww)
        want_avg = np.zeros(shape)
        want_avg[:, :, :hh, :ww] = np.broadcast_to(mean / 4, win.shape).reshape(n, c, hh, ww)
        want_ada = np.broadcast_to(xv.astype(np.float64).mean(axis=(2, 3), keepdims=True) / (h * w),
                                   shape)
        got = [r.numpy() for r in exe.run({x: xv})]
        for have, want in zip(got, (want_max, want_avg, want_ada)):
            assert have.shape == shape
            np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(kiln.ShapeError, match="one entry per dim"):
        kiln.max_pool_grad(m, idx, kiln.shape_of(kiln.reshape(x, [-1])))


def test_topk_and_one_hot_sized_by_values_from_shapes(rng):
    # k = half of x's last dim, depth = x's last dim: both known once the feed's shape is
    g = kiln.Graph()
    x = g.placeholder([None, None], kiln.f32, "x")
    ids = g.placeholder([None], kiln.i64, "ids")
    size = kiln.gather(kiln.shape_of(x), g.constant(np.array(1, np.int64)))
    top, where = kiln.topk(x, kiln.div(size, g.constant(np.array(2, np.int64))), 1)
    hot = kiln.one_hot(ids, size, -1, kiln.f32, 2.0, -1.0)
    assert top.shape == (-1, -1) and hot.shape == (-1, -1)
    exe = g.compile([top, where, hot])
    for n, m in ((3, 8), (2, 11), (4, 2)):
        xv = rng.permutation(n * m).reshape(n, m).astype(np.float32)
        iv = rng.integers(0, m + 2, 5)  # past the depth: rows of off_value
        got = [r.numpy() for r in exe.run({x: xv, ids: iv})]
        order = np.argsort(-xv, axis=1, kind="stable")[:, : m // 2]
        np.testing.assert_array_equal(got[1], order)
        np.testing.assert_array_equal(got[0], np.take_along_axis(xv, order, 1))
        want = np.where(iv[:, None] == np.arange(m)[None, :], 2.0, -1.0)
        np.testing.assert_array_equal(got[2], want)
    # k larger than the dim: the topk's own message, before any kernel runs
    g2 = kiln.Graph()
    y = g2.placeholder([None, None], kiln.f32, "y")
    rows = kiln.gather(kiln.shape_of(y), g2.constant(np.array(0, np.int64)))
    bad = g2.compile([kiln.topk(y, rows, 1)[0]])
    with pytest.raises(kiln.ShapeError, match=r"\[topk\] k = 5 does not fit axis 1"):
        bad.run({y: np.zeros((5, 3), np.float32)})
    with pytest.raises(kiln.ShapeError, match="one element"):
        kiln.topk(y, kiln.shape_of(y), 1)


def test_topk_with_a_computed_k_has_a_gradient(rng):
    # the gradient goes to the k largest of each row; the k value itself takes none
    g = kiln.Graph()
    x = g.placeholder([None, None], kiln.f32, "x")
    half = kiln.div(kiln.gather(kiln.shape_of(x), g.constant(np.array(1, np.int64))),
                    g.constant(np.array(2, np.int64)))
    top, _ = kiln.topk(x, half, 1)
    (dx,) = kiln.gradients(kiln.sum(top * top), [x])
    exe = g.compile([dx])
    for n, m in ((2, 6), (3, 9)):
        xv = rng.permutation(n * m).reshape(n, m).astype(np.float32)
        kth = np.sort(xv, axis=1)[:, m - m // 2][:, None]
        np.testing.assert_array_equal(exe.run({x: xv})[0].numpy(), np.where(xv >= kth, 2 * xv, 0))
