"""The 8-bit floats against ml_dtypes: kiln's cast op rounds as ml_dtypes does (saturating as
ONNX's Cast: clipped to the largest finite value first), on the CPU and on CUDA; arrays move
through numpy as ml_dtypes' types."""
import ml_dtypes
import numpy as np
import pytest

import kiln
from conftest import cuda_available

KINDS = [
    (kiln.f8e4m3fn, ml_dtypes.float8_e4m3fn),
    (kiln.f8e4m3fnuz, ml_dtypes.float8_e4m3fnuz),
    (kiln.f8e5m2, ml_dtypes.float8_e5m2),
    (kiln.f8e5m2fnuz, ml_dtypes.float8_e5m2fnuz),
]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not cuda_available(), reason="no CUDA device"))]


def probes(rng, ml, dtype):
    """Every code's value, the midpoints between neighbours (ties) and the values next to them,
    values past the largest, specials, random values; both signs."""
    codes = np.arange(256, dtype=np.uint8).view(ml).astype(np.float64)
    finite = np.unique(np.abs(codes[np.isfinite(codes)]))
    mids = (finite[:-1] + finite[1:]) / 2
    top = float(ml_dtypes.finfo(ml).max)
    with np.errstate(over="ignore"):  # (past float16's range: infinities)
        x = np.concatenate([finite, mids, np.nextafter(mids, np.inf), np.nextafter(mids, 0),
                            [top * 1.03, top * 1.1, top * 4, 1e30, np.inf, np.nan, 1e-30],
                            np.exp2(rng.uniform(-20, 17, 4000))]).astype(dtype)
    return np.concatenate([x, -x])


def reference(x, ml, saturate):
    if not saturate:
        return x.astype(ml)
    top = ml_dtypes.finfo(ml).max
    return np.clip(x, -top, top).astype(ml)


def rounds_f64_once(ml):
    """Whether this ml_dtypes rounds a float64 to `ml` once (older versions go through float32,
    which rounds twice): just past the midpoint of 1 and the next code, once gives the next code,
    twice gives the tie's even code, 1."""
    codes = np.unique(np.arange(256, dtype=np.uint8).view(ml).astype(np.float64))
    above = codes[codes > 1].min()
    mid = (1 + above) / 2
    return float(np.array([mid + mid * 2.0 ** -40]).astype(ml).astype(np.float64)[0]) == above


def same_codes(got, want):
    """Equal codes, where NaNs may differ in their bits."""
    g, w = got.astype(np.float64), want.astype(np.float64)
    keep = ~np.isnan(w)
    return np.array_equal(np.isnan(g), ~keep) and np.array_equal(g[keep], w[keep]) and \
        np.array_equal(np.signbit(g[keep]), np.signbit(w[keep]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind,ml", KINDS, ids=[k.name for k, _ in KINDS])
@pytest.mark.parametrize("src", [np.float32, np.float64, np.float16])
def test_cast_rounds_as_ml_dtypes(rng, device, kind, ml, src):
    x = probes(rng, ml, src)
    g = kiln.Graph()
    t = g.placeholder([len(x)], kiln.dtype(src), "x")
    outs = [kiln.cast(t, kind), kiln.cast(t, kind, saturate=False)]
    outs.append(kiln.cast(outs[1], kiln.f32))
    got = [o.numpy() for o in g.compile(outs, device=device).run({t: x})]
    sat, wrap, back = got
    assert sat.dtype == np.dtype(ml) and wrap.dtype == np.dtype(ml)
    if device != "cpu":  # every probe as the CPU gives it (checked against ml_dtypes below)
        cpu = [o.numpy() for o in g.compile(outs, device="cpu").run({t: x})]
        assert same_codes(sat, cpu[0]) and same_codes(wrap, cpu[1])
    if src == np.float64 and not rounds_f64_once(ml):
        # this ml_dtypes rounds float64 through float32: compare where that is exact
        exact = np.isnan(x) | (x == x.astype(np.float32).astype(np.float64))
        x, sat, wrap, back = x[exact], sat[exact], wrap[exact], back[exact]
    assert same_codes(sat, reference(x, ml, True))
    assert same_codes(wrap, reference(x, ml, False))
    np.testing.assert_array_equal(back, reference(x, ml, False).astype(np.float32))


@pytest.mark.parametrize("kind,ml", KINDS, ids=[k.name for k, _ in KINDS])
def test_arrays_move_as_ml_dtypes(rng, kind, ml):
    codes = np.arange(256, dtype=np.uint8).view(ml).reshape(16, 16)
    a = kiln.Array(codes)
    assert a.dtype == kind and kind.itemsize == 1 and kind.is_float8 and not kind.is_floating
    assert kind.numpy == np.dtype(ml) and kiln.dtype(ml) == kind and kiln.dtype(kind.name) == kind
    assert np.array_equal(a.numpy().view(np.uint8), codes.view(np.uint8))
    # bytes through the ops that move them, decoded to f32 at the end
    g = kiln.Graph()
    t = g.placeholder([16, 16], kind, "codes")
    out = g.compile([kiln.cast(kiln.transpose(t, [1, 0]), kiln.f32)], device="cpu").run({t: a})
    np.testing.assert_array_equal(out[0].numpy(), codes.T.astype(np.float32))
    with pytest.raises(kiln.DTypeError, match=kind.name):
        a.to_dlpack() if hasattr(a, "to_dlpack") else a.__dlpack__()


def test_arithmetic_on_an_8_bit_float_names_it():
    g = kiln.Graph()
    t = g.placeholder([4], kiln.f8e4m3fn, "x")
    with pytest.raises(kiln.Error, match="f8e4m3fn"):
        kiln.add(t, t)
