"""cond, while_loop and for_loop with Python functions as bodies, against numpy loops."""
import numpy as np
import pytest

import kiln


def test_cond_runs_the_branch_taken(rng):
    g = kiln.Graph()
    pred = g.placeholder([], kiln.bool_, "pred")
    x = g.placeholder([3, 4], kiln.f32, "x")
    w = g.placeholder([4], kiln.f32, "w")
    (y,) = kiln.cond(pred, [x], lambda a: kiln.relu(a * w) + 1.0, lambda a: a - w)
    exe = g.compile([y], device=kiln.default_device())
    xv = rng.standard_normal((3, 4)).astype(np.float32)
    wv = rng.standard_normal(4).astype(np.float32)
    for taken in (True, False):
        got = exe.run({pred: np.array(taken), x: xv, w: wv})[0].numpy()
        want = np.maximum(xv * wv, 0) + 1 if taken else xv - wv
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_while_loop_and_its_errors(rng):
    g = kiln.Graph()
    x0 = g.placeholder([5], kiln.f32, "x0")
    limit = g.placeholder([], kiln.f32, "limit")
    i0 = g.placeholder([], kiln.i64, "i0")
    i, x = kiln.while_loop(
        [i0, x0],
        lambda i, x: kiln.less(kiln.sum(x), limit),
        lambda i, x: [i + 1, x * 1.5 + 0.25],
        max_trip_count=200,
    )
    exe = g.compile([i, x], device=kiln.default_device())
    xv = rng.uniform(0.1, 1.0, 5).astype(np.float32)
    lim = np.float32(rng.uniform(10, 500))
    want, trips = xv.copy(), 0
    while want.sum(dtype=np.float32) < lim:
        want, trips = want * np.float32(1.5) + np.float32(0.25), trips + 1
    gi, gx = (a.numpy() for a in exe.run({x0: xv, limit: np.array(lim), i0: np.array(0)}))
    assert int(gi) == trips
    np.testing.assert_allclose(gx, want, rtol=1e-5)
    with pytest.raises(kiln.ValueError, match="max_trip_count = 200"):
        exe.run({x0: xv, limit: np.array(np.float32(np.inf)), i0: np.array(0)})
    with pytest.raises(kiln.ShapeError, match="body result 1 is f32"):
        kiln.while_loop([i0, x0], lambda i, x: i < 3, lambda i, x: [i, kiln.concat([x, x])])
    with pytest.raises(TypeError, match="body_fn's results"):
        kiln.while_loop([i0], lambda i: i < 3, lambda i: 3)


def test_for_loop_recurrence_and_python_errors(rng):
    g = kiln.Graph()
    h0 = g.placeholder([2, 8], kiln.f32, "h0")
    w = g.placeholder([8, 8], kiln.f32, "w")
    xs = g.placeholder([5, 2, 8], kiln.f32, "xs")
    (h,) = kiln.for_loop(5, [h0], lambda i, h: kiln.tanh(kiln.matmul(h, w) + kiln.gather(xs, i, 0)))
    exe = g.compile([h], device=kiln.default_device())
    hv = rng.standard_normal((2, 8)).astype(np.float32)
    wv = (rng.standard_normal((8, 8)) * 0.3).astype(np.float32)
    xv = rng.standard_normal((5, 2, 8)).astype(np.float32)
    want = hv.astype(np.float64)
    for t in range(5):
        want = np.tanh(want @ wv + xv[t])
    got = exe.run({h0: hv, w: wv, xs: xv})[0].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    def fails(i, h):
        raise RuntimeError("from the body")

    with pytest.raises(RuntimeError, match="from the body"):
        kiln.for_loop(3, [h0], fails)
    # the graph is still usable after a body raised
    (h2,) = kiln.for_loop(2, [h0], lambda i, h: h * 2.0)
    got = g.compile([h2], device=kiln.default_device()).run({h0: hv})[0].numpy()
    np.testing.assert_allclose(got, hv * 4, rtol=1e-6)


def test_gradients_through_cond_and_for_loop(rng):
    g = kiln.Graph()
    h0 = g.placeholder([2, 3], kiln.f64, "h0")
    w = g.placeholder([3, 3], kiln.f64, "w")
    (h,) = kiln.for_loop(3, [h0], lambda i, h: kiln.tanh(kiln.matmul(h, w)))
    (y,) = kiln.cond(kiln.sum(h) < 100.0, [h], lambda a: a * a, lambda a: a)
    loss = kiln.sum(y)
    dh0, dw = kiln.gradients(loss, [h0, w])
    exe = g.compile([loss, dh0, dw], device="cpu")
    hv, wv = rng.standard_normal((2, 3)), rng.standard_normal((3, 3)) * 0.5
    _, gh, gw = (a.numpy() for a in exe.run({h0: hv, w: wv}))

    def f(hv, wv):
        a = hv
        for _ in range(3):
            a = np.tanh(a @ wv)
        return float((a * a).sum())

    eps = 1e-6
    for idx in [(0, 0), (1, 2)]:
        d = np.zeros_like(hv)
        d[idx] = eps
        assert abs((f(hv + d, wv) - f(hv - d, wv)) / (2 * eps) - gh[idx]) < 1e-6
    d = np.zeros_like(wv)
    d[2, 1] = eps
    assert abs((f(hv, wv + d) - f(hv, wv - d)) / (2 * eps) - gw[2, 1]) < 1e-6


def test_loops_recorded_on_the_gpu(rng):
    """On a GPU the loop is a conditional node of the run's CUDA graph from the second run on:
    the same results as with capture off, and numpy's."""
    if kiln.cuda_device_count() == 0:
        pytest.skip("no CUDA device")
    g = kiln.Graph()
    x0 = g.placeholder([257], kiln.f32, "x0")
    n = g.placeholder([], kiln.i64, "n")
    i0 = g.placeholder([], kiln.i64, "i0")
    _, x = kiln.while_loop([i0, x0], lambda i, x: i < n, lambda i, x: [i + 1, x * 0.9 + 0.5])
    (y,) = kiln.for_loop(
        n, [x], lambda i, y: kiln.cond(i < 2, [y], lambda a: [a * 2.0], lambda a: [a - 1.0])
    )
    recorded = g.compile([y], device="cuda:0")
    stepwise = g.compile([y], device="cuda:0", options=kiln.CompileOptions(capture=False))
    for trips in (3, 0, 5, 1):
        xv = rng.standard_normal(257).astype(np.float32)
        want = xv.astype(np.float64)
        for _ in range(trips):
            want = want * 0.9 + 0.5
        for k in range(trips):
            want = want * 2 if k < 2 else want - 1
        feeds = {x0: xv, n: np.array(trips), i0: np.array(0)}
        np.testing.assert_allclose(recorded.run(feeds)[0].numpy(), want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(stepwise.run(feeds)[0].numpy(), want, rtol=1e-5, atol=1e-5)
    assert recorded.capture_status == "recorded once, replayed from the second run"
    assert recorded.replayed_runs >= 3
    assert stepwise.replayed_runs == 0
