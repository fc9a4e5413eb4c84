"""Core ML control flow (kiln.coreml): ML Programs with MIL's `cond` and `while_loop`, built with
coremltools' MIL builder, imported onto kiln's cond and while_loop and run against numpy
references on fresh random data: predicates and trip counts fed at run time (both branches, and
zero, one and several iterations, from one compiled executable), branches and bodies reading
values of the blocks around them, several outputs and loop variables, a cond inside a loop body
and a loop inside a branch, a predicate known while importing, and the forms kiln does not map
(a loop variable changing shape, an unmapped op inside a body)."""
import itertools
import os

import coreml_util
import numpy as np
import pytest
from coreml_util import mb, program, save

import kiln

F32 = np.float32
I32 = np.int32

DEVICES = ["cpu"] + (["cuda"] if kiln.cuda_device_count() > 0 else [])


_origin = {}  # id of a CPU executable -> (model, package path, executable), for recording
_saved = itertools.count()  # (each program its own package: a recorded one is never overwritten)


def compiled(prog, tmp_path, device):
    """The program saved, imported and compiled: (model, executable)."""
    path = save(prog, tmp_path / f"m{next(_saved)}.mlpackage")
    m = kiln.coreml.load(path)
    exe = m.compile(device=device)
    if device == "cpu" and os.environ.get("KILN_COREML_RECORD"):
        _origin[id(exe)] = (m, str(path), exe)
    return m, exe


def outputs(exe, feeds):
    outs = [o.numpy() for o in exe.run(feeds)]
    if id(exe) in _origin and _origin[id(exe)][2] is exe:  # a case for the replay on CUDA
        m, path, _ = _origin[id(exe)]
        coreml_util.record(os.environ["KILN_COREML_RECORD"], m, path, feeds, outs, {}, None)
    return outs


@pytest.mark.parametrize("device", DEVICES)
def test_cond_runtime_predicate_takes_both_branches(rng, tmp_path, device):
    @program(((4, 3), F32), ((4, 3), F32), ((3,), F32))
    def prog(x, w, b):
        p = mb.greater(x=mb.reduce_sum(x=x), y=0.0)
        # both branches read values of the function's block (x, w, b and a const made before)
        scale = mb.const(val=np.float32(1.5))
        return mb.cond(
            pred=p,
            _true_fn=lambda: (mb.add(x=mb.mul(x=x, y=w), y=b), mb.reduce_max(x=x, axes=[1])),
            _false_fn=lambda: (mb.mul(x=mb.sub(x=x, y=w), y=scale), mb.reduce_min(x=x, axes=[1])))

    m, exe = compiled(prog, tmp_path, device)
    assert m.op_histogram["cond"] == 1
    w = rng.standard_normal((4, 3)).astype(F32)
    b = rng.standard_normal(3).astype(F32)
    taken = set()
    for sign in (1, -1, 1, -1):
        x = (np.abs(rng.standard_normal((4, 3))) * sign).astype(F32)
        y, r = outputs(exe, {"x": x, "w": w, "b": b})
        if x.sum() > 0:
            want_y, want_r = x * w + b, x.max(axis=1)
        else:
            want_y, want_r = (x - w) * 1.5, x.min(axis=1)
        taken.add(bool(x.sum() > 0))
        np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(r, want_r, rtol=1e-6)
    assert taken == {True, False}


@pytest.mark.parametrize("device", DEVICES)
def test_cond_branch_returning_outer_values_and_consts(rng, tmp_path, device):
    # a branch may give a value of the block around it as it is, or a const of its own; the
    # predicate comes straight from a bool computed on an input
    @program(((5,), F32), ((1,), I32))
    def prog(x, k):
        p = mb.squeeze(x=mb.greater(x=k, y=np.int32(2)))
        return mb.cond(pred=p,
                       _true_fn=lambda: (x, mb.const(val=np.int32(7))),
                       _false_fn=lambda: (mb.exp(x=x), mb.reduce_sum(x=k, keep_dims=False)))

    _, exe = compiled(prog, tmp_path, device)
    x = rng.standard_normal(5).astype(F32)
    for k in (0, 2, 3, 9):
        y, z = outputs(exe, {"x": x, "k": np.array([k], I32)})
        np.testing.assert_allclose(y, x if k > 2 else np.exp(x), rtol=1e-5)
        assert z.dtype == I32 and int(z) == (7 if k > 2 else k)


@pytest.mark.parametrize("taken", [True, False])
def test_cond_known_predicate_maps_the_taken_branch(rng, tmp_path, taken):
    @program(((3, 2), F32))
    def prog(x):
        p = mb.const(val=np.bool_(taken))
        return mb.cond(pred=p, _true_fn=lambda: mb.relu(x=x), _false_fn=lambda: mb.mul(x=x, y=-2.0))

    m, exe = compiled(prog, tmp_path, "cpu")
    x = rng.standard_normal((3, 2)).astype(F32)
    (y,) = outputs(exe, {"x": x})
    np.testing.assert_allclose(y, np.maximum(x, 0) if taken else x * -2.0, rtol=1e-6)
    # the branch not taken is not mapped
    assert m.op_histogram.get("relu", 0) == int(taken)
    assert m.op_histogram.get("mul", 0) == int(not taken)


def _loop_ref(x, w, n):
    i, acc = 0, np.zeros_like(x)
    while i < n:
        acc = acc + x
        x = np.tanh(x @ w)
        i += 1
    return i, x, acc


@pytest.mark.parametrize("device", DEVICES)
def test_while_loop_runtime_trip_count(rng, tmp_path, device):
    # three loop variables (a counter, a state, an accumulator); the condition reads the fed
    # trip count and the body a weight, both from the function's block
    @program(((2, 4), F32), ((4, 4), F32), ((1,), I32))
    def prog(x, w, n):
        limit = mb.squeeze(x=n)
        i0 = mb.const(val=np.int32(0))
        acc0 = mb.mul(x=x, y=0.0)

        def body(i, h, acc):
            return mb.add(x=i, y=1), mb.tanh(x=mb.matmul(x=h, y=w)), mb.add(x=acc, y=h)

        return mb.while_loop(_cond=lambda i, h, acc: mb.less(x=i, y=limit), _body=body,
                             loop_vars=(i0, x, acc0))

    m, exe = compiled(prog, tmp_path, device)
    assert m.op_histogram["while_loop"] == 1
    w = (rng.standard_normal((4, 4)) * 0.5).astype(F32)
    for n in (0, 1, 6, 3):
        x = rng.standard_normal((2, 4)).astype(F32)
        i, h, acc = outputs(exe, {"x": x, "w": w, "n": np.array([n], I32)})
        want_i, want_h, want_acc = _loop_ref(x.astype(np.float64), w.astype(np.float64), n)
        assert i.dtype == I32 and int(i) == want_i
        np.testing.assert_allclose(h, want_h, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(acc, want_acc, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_while_loop_condition_on_the_carried_values(rng, tmp_path, device):
    # no counter: the loop doubles x until its sum passes a fed limit (a data-dependent count)
    @program(((3,), F32), ((1,), F32))
    def prog(x, limit):
        lim = mb.squeeze(x=limit)
        return mb.while_loop(_cond=lambda v: mb.less(x=mb.reduce_sum(x=v), y=lim),
                             _body=lambda v: mb.add(x=mb.mul(x=v, y=2.0), y=0.25),
                             loop_vars=(x,))

    _, exe = compiled(prog, tmp_path, device)
    for lim in (-1.0, 5.0, 300.0):
        x = np.abs(rng.standard_normal(3)).astype(F32) + 0.1
        (got,) = outputs(exe, {"x": x, "limit": np.array([lim], F32)})
        want = x.astype(np.float64)
        while want.sum() < lim:
            want = want * 2.0 + 0.25
        np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_cond_inside_a_loop_body(rng, tmp_path, device):
    # each iteration branches on the counter's parity and on a fed threshold
    @program(((4,), F32), ((1,), I32), ((1,), F32))
    def prog(x, n, t):
        limit, thr = mb.squeeze(x=n), mb.squeeze(x=t)

        def body(i, v):
            odd = mb.equal(x=mb.mod(x=i, y=2), y=1)
            big = mb.greater(x=mb.reduce_max(x=v), y=thr)
            p = mb.logical_and(x=odd, y=big)
            nv = mb.cond(pred=p, _true_fn=lambda: mb.mul(x=v, y=0.5),
                         _false_fn=lambda: mb.add(x=v, y=x))
            return mb.add(x=i, y=1), nv

        return mb.while_loop(_cond=lambda i, v: mb.less(x=i, y=limit), _body=body,
                             loop_vars=(mb.const(val=np.int32(0)), x))

    m, exe = compiled(prog, tmp_path, device)
    assert m.op_histogram["cond"] == 1 and m.op_histogram["while_loop"] == 1
    for n, thr in ((0, 0.0), (1, 0.0), (7, 1.0), (9, -5.0)):
        x = rng.standard_normal(4).astype(F32)
        i, v = outputs(exe, {"x": x, "n": np.array([n], I32), "t": np.array([thr], F32)})
        want = x.astype(np.float64)
        for k in range(n):
            want = want * 0.5 if k % 2 == 1 and want.max() > thr else want + x
        assert int(i) == n
        np.testing.assert_allclose(v, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_loop_inside_a_branch_and_a_loop_inside_a_loop(rng, tmp_path, device):
    # a cond whose true branch runs a loop over a fed count; the loop's body runs a loop of its
    # own reading the outer loop's variable (captured through two bodies)
    @program(((3,), F32), ((1,), I32))
    def prog(x, n):
        limit = mb.squeeze(x=n)

        def inner(v, j0):
            (w, _) = mb.while_loop(_cond=lambda w, j: mb.less(x=j, y=j0),
                                   _body=lambda w, j: (mb.add(x=w, y=x), mb.add(x=j, y=1)),
                                   loop_vars=(v, mb.const(val=np.int32(0))))
            return w

        def outer():
            (i, v) = mb.while_loop(
                _cond=lambda i, v: mb.less(x=i, y=limit),
                _body=lambda i, v: (mb.add(x=i, y=1), inner(v, i)),
                loop_vars=(mb.const(val=np.int32(0)), x))
            return v

        return mb.cond(pred=mb.greater(x=limit, y=np.int32(0)), _true_fn=outer,
                       _false_fn=lambda: mb.mul(x=x, y=-1.0))

    _, exe = compiled(prog, tmp_path, device)
    for n in (0, 1, 4):
        x = rng.standard_normal(3).astype(F32)
        (got,) = outputs(exe, {"x": x, "n": np.array([n], I32)})
        # iteration i adds x i times: x * (1 + 0 + 1 + ... + (n-1))
        want = x * (1 + n * (n - 1) // 2) if n > 0 else -x
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_loop_over_a_flexible_input(rng, tmp_path, device):
    # an input with a dim unknown while importing (1 to 64): the loop carries it at the fed size,
    # each executable specialization with its own
    from coremltools.converters.mil.mil import get_new_symbol, types

    @mb.program(input_specs=[mb.TensorSpec(shape=(2, get_new_symbol())),
                             mb.TensorSpec(shape=(1,), dtype=types.int32)])
    def prog(x, n):
        limit = mb.squeeze(x=n)

        def body(i, v):
            p = mb.greater(x=mb.reduce_sum(x=v), y=0.0)
            nv = mb.cond(pred=p, _true_fn=lambda: mb.sub(x=v, y=x),
                         _false_fn=lambda: mb.add(x=v, y=mb.mul(x=x, y=2.0)))
            return mb.add(x=i, y=1), nv

        return mb.while_loop(_cond=lambda i, v: mb.less(x=i, y=limit), _body=body,
                             loop_vars=(mb.const(val=np.int32(0)), x))

    m, exe = compiled(prog, tmp_path, device)
    assert tuple(m.inputs[0].shape) == (2, -1)
    for cols, n in ((3, 4), (7, 2), (5, 0), (3, 5)):
        x = rng.standard_normal((2, cols)).astype(F32)
        i, v = outputs(exe, {"x": x, "n": np.array([n], I32)})
        want = x.astype(np.float64)
        for _ in range(n):
            want = want - x if want.sum() > 0 else want + 2.0 * x
        assert int(i) == n and v.shape == (2, cols)
        np.testing.assert_allclose(v, want, rtol=1e-5, atol=1e-5)


def test_unsupported_forms_fail_clearly(tmp_path):
    # a loop variable that grows in the body: kiln's while_loop carries fixed shapes
    @program(((2,), F32), ((1,), I32))
    def grows(x, n):
        limit = mb.squeeze(x=n)
        return mb.while_loop(
            _cond=lambda i, v: mb.less(x=i, y=limit),
            _body=lambda i, v: (mb.add(x=i, y=1), mb.concat(values=[v, x], axis=0)),
            loop_vars=(mb.const(val=np.int32(0)), x))

    with pytest.raises(kiln.UnsupportedError, match="while_loop.*fixed shapes"):
        kiln.coreml.load(save(grows, tmp_path / "grows.mlpackage"))

    # an op kiln does not map inside a body is reported with the others, by name
    @program(((4,), F32), ((1,), I32))
    def unmapped(x, n):
        p = mb.squeeze(x=mb.greater(x=n, y=np.int32(0)))
        y = mb.cond(pred=p, _true_fn=lambda: mb.add(x=x, y=mb.random_uniform(shape=[4])),
                    _false_fn=lambda: x)
        return y, mb.non_zero(x=x)

    with pytest.raises(kiln.UnsupportedError) as e:
        kiln.coreml.load(save(unmapped, tmp_path / "unmapped.mlpackage"))
    assert "random_uniform" in str(e.value) and "non_zero" in str(e.value)
    assert "nested blocks" not in str(e.value)

    # the supported parts still run: the same cond without the unmapped op
    @program(((4,), F32), ((1,), I32))
    def fine(x, n):
        p = mb.squeeze(x=mb.greater(x=n, y=np.int32(0)))
        return mb.cond(pred=p, _true_fn=lambda: mb.add(x=x, y=1.0), _false_fn=lambda: x)

    _, exe = compiled(fine, tmp_path, "cpu")
    x = np.arange(4, dtype=F32)
    np.testing.assert_array_equal(outputs(exe, {"x": x, "n": np.array([1], I32)})[0], x + 1)
    np.testing.assert_array_equal(outputs(exe, {"x": x, "n": np.array([0], I32)})[0], x)
