"""The unsigned integer dtypes u16, u32 and u64 against numpy: arithmetic wraps, division floors
(x / 0 and x mod 0 are 0), shifts past the width give 0, comparisons, bitwise ops, reductions,
sorting and casts (which saturate at the target's range, where numpy's astype wraps), over the
whole range of each type (u64 past 2^63, where a detour through int64 or double would show), on
the CPU and on CUDA."""
import numpy as np
import pytest

import kiln
from conftest import cuda_available

TYPES = [(kiln.u16, np.uint16), (kiln.u32, np.uint32), (kiln.u64, np.uint64)]
IDS = [k.name for k, _ in TYPES]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not cuda_available(), reason="no CUDA device"))]


def draw(rng, np_type, shape, small=False):
    """Values over the whole range (a third of them near each end and near 0), or small ones."""
    info = np.iinfo(np_type)
    if small:
        return rng.integers(0, 40, size=shape, dtype=np_type)
    n = int(np.prod(shape))
    whole = rng.integers(0, info.max, size=n, dtype=np_type, endpoint=True)
    low = rng.integers(0, 300, size=n, dtype=np_type)
    high = (info.max - rng.integers(0, 300, size=n, dtype=np_type)).astype(np_type)
    pick = rng.integers(0, 3, size=n)
    return np.where(pick == 0, whole, np.where(pick == 1, low, high)).astype(np_type).reshape(shape)


def run(device, fn, *arrays):
    g = kiln.Graph()
    ts = [g.placeholder(list(a.shape), kiln.dtype(a.dtype), f"x{i}") for i, a in enumerate(arrays)]
    outs = fn(*ts)
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    got = g.compile(list(outs), device=device).run(dict(zip(ts, arrays)))
    return [o.numpy() for o in got]


def same(got, want):
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)


BINARY = [
    ("add", kiln.add, np.add),
    ("sub", kiln.sub, np.subtract),
    ("mul", kiln.mul, np.multiply),
    ("div", kiln.div, np.floor_divide),
    ("mod", kiln.mod, np.mod),
    ("maximum", kiln.maximum, np.maximum),
    ("minimum", kiln.minimum, np.minimum),
    ("bitwise_and", kiln.bitwise_and, np.bitwise_and),
    ("bitwise_or", kiln.bitwise_or, np.bitwise_or),
    ("bitwise_xor", kiln.bitwise_xor, np.bitwise_xor),
    ("equal", kiln.equal, np.equal),
    ("not_equal", kiln.not_equal, np.not_equal),
    ("less", kiln.less, np.less),
    ("less_equal", kiln.less_equal, np.less_equal),
    ("greater", kiln.greater, np.greater),
    ("greater_equal", kiln.greater_equal, np.greater_equal),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind,np_type", TYPES, ids=IDS)
@pytest.mark.parametrize("name,op,ref", BINARY, ids=[b[0] for b in BINARY])
def test_binary_ops_match_numpy(rng, device, kind, np_type, name, op, ref):
    a = draw(rng, np_type, (6, 257))
    b = draw(rng, np_type, (257,))
    b[:5] = 0  # (division and mod by zero give 0, as in numpy)
    b[5:9] = a[0, 5:9]  # (equal elements for the comparisons)
    got = run(device, op, a, b)[0]
    with np.errstate(divide="ignore", over="ignore"):
        same(got, ref(a, b))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind,np_type", TYPES, ids=IDS)
def test_pow_and_shifts_wrap_as_numpy(rng, device, kind, np_type):
    bits = np.iinfo(np_type).bits
    base = draw(rng, np_type, (300,))
    exp = rng.integers(0, 70, size=300).astype(np_type)
    shift = rng.integers(0, bits + 3, size=300).astype(np_type)  # past the width: 0
    got = run(device, lambda x, e, s: [kiln.pow(x, e), kiln.bit_shift(x, s, left=True),
                                       kiln.bit_shift(x, s, left=False)], base, exp, shift)
    same(got[0], np.power(base, exp))
    same(got[1], np.left_shift(base, shift))
    same(got[2], np.right_shift(base, shift))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind,np_type", TYPES, ids=IDS)
def test_unary_ops_and_reductions_match_numpy(rng, device, kind, np_type):
    x = draw(rng, np_type, (5, 129))
    small = draw(rng, np_type, (5, 129), small=True)
    got = run(device, lambda t, s: [
        kiln.abs(t), kiln.sign(t), kiln.bitwise_not(t), kiln.floor(t), kiln.round(t),
        kiln.max(t, [1]), kiln.min(t, [0]), kiln.argmax(t, 1), kiln.argmin(t, 0),
        kiln.sum(t, [1]), kiln.prod(s, [0]), kiln.cumsum(t, 1)], x, small)
    same(got[0], x)
    same(got[1], np.sign(x))
    same(got[2], np.invert(x))
    same(got[3], x)
    same(got[4], x)
    same(got[5], x.max(axis=1))
    same(got[6], x.min(axis=0))
    np.testing.assert_array_equal(got[7], x.argmax(axis=1))
    np.testing.assert_array_equal(got[8], x.argmin(axis=0))
    same(got[9], x.sum(axis=1, dtype=np_type))  # (wrapping, in the type itself)
    same(got[10], small.prod(axis=0, dtype=np_type))
    same(got[11], np.cumsum(x, axis=1, dtype=np_type))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind,np_type", TYPES, ids=IDS)
def test_sort_topk_gather_where_match_numpy(rng, device, kind, np_type):
    x = draw(rng, np_type, (4, 300))
    idx = rng.integers(0, 300, size=(4, 50)).astype(np.uint32)  # (unsigned indices too)
    cond = rng.integers(0, 2, size=(4, 300)).astype(bool)
    got = run(device, lambda t, i, c: [
        kiln.sort(t, 1), kiln.topk(t, 7, 1)[0], kiln.gather_elements(t, i, 1),
        kiln.where(c, t, kiln.bitwise_not(t)), kiln.concat([t, t], 0)], x, idx, cond)
    same(got[0], np.sort(x, axis=1))
    same(got[1], np.sort(x, axis=1)[:, ::-1][:, :7])
    same(got[2], np.take_along_axis(x, idx.astype(np.int64), 1))
    same(got[3], np.where(cond, x, np.invert(x)))
    same(got[4], np.concatenate([x, x], 0))


def saturated(x, to):
    """x (any numeric numpy array) as `to`, saturating at to's range (NaN gives 0), truncating
    floats toward zero: kiln's cast between integer types and from floats."""
    if np.issubdtype(to, np.floating):
        return x.astype(to)
    if to == np.bool_:
        return x != 0
    info = np.iinfo(to)
    if np.issubdtype(x.dtype, np.floating):
        t = np.trunc(np.nan_to_num(x.astype(np.float64), nan=0.0))
        out = np.zeros(x.shape, dtype=to)
        out[t <= float(info.min)] = info.min
        out[t >= float(info.max)] = info.max
        mid = (t > float(info.min)) & (t < float(info.max))
        out[mid] = t[mid].astype(to)
        return out
    vals = [min(max(int(v), info.min), info.max) for v in x.ravel().tolist()]
    return np.array(vals, dtype=to).reshape(x.shape)


OTHERS = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
          np.float32, np.float64, np.bool_]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind,np_type", TYPES, ids=IDS)
def test_casts_saturate_between_integer_types(rng, device, kind, np_type):
    x = draw(rng, np_type, (3, 100))
    signed = np.concatenate([draw(rng, np.uint64, (100,)).view(np.int64),
                             rng.integers(-300, 300, size=100),
                             np.array([-2**63, 2**63 - 1, -1, 0, 1], dtype=np.int64)])
    floats = np.concatenate([rng.uniform(-10.0, float(np.iinfo(np_type).max) * 1.1, 200),
                             [np.nan, np.inf, -np.inf, -0.7, 0.7, 2.0**64, 2.0**63]])
    got = run(device, lambda t, s, f: [kiln.cast(t, kiln.dtype(o)) for o in OTHERS] +
              [kiln.cast(s, kind), kiln.cast(f, kind)], x, signed, floats)
    for o, g in zip(OTHERS, got):
        same(g, saturated(x, o))
    same(got[-2], saturated(signed, np_type))
    same(got[-1], saturated(floats, np_type))


@pytest.mark.parametrize("kind,np_type", TYPES, ids=IDS)
def test_promotion_follows_numpy(kind, np_type):
    """Between integer types: the wider of one signedness; an unsigned and a signed type, the
    next signed type that holds both (u64 with a signed type: f64, as numpy)."""
    g = kiln.Graph()
    u = g.placeholder([2], kind, "u")
    for other in [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64,
                  np.uint64]:
        t = g.placeholder([2], kiln.dtype(other), f"o{np.dtype(other).name}")
        assert kiln.add(u, t).dtype == kiln.dtype(np.promote_types(np_type, other))


@pytest.mark.parametrize("kind,np_type", TYPES, ids=IDS)
def test_arrays_and_dlpack_carry_the_type(rng, kind, np_type):
    x = draw(rng, np_type, (7, 9))
    a = kiln.Array(x)
    assert a.dtype == kind and kind.is_integer and kind.itemsize == np.dtype(np_type).itemsize
    assert kiln.dtype(kind.name) == kind and kind.numpy == np.dtype(np_type)
    same(a.numpy(), x)
    same(np.from_dlpack(a), x)
