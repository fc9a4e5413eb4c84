"""The narrow storage types f8e8m0fnu, f4e2m1fn, i4, u4, i2 and u2 against independent references,
on the CPU and on CUDA: every code decodes to ml_dtypes' value; f4e2m1fn rounds as ml_dtypes does
(nearest even, saturating at 6; NaN gives 6 as ONNX's float4 note says, where ml_dtypes gives -0);
the integers round to nearest even and saturate (numpy's rint and clip); f8e8m0fnu rounds as
onnx.numpy_helper.to_float8e8m0 in each of its three modes, saturating or not. Arrays move through
numpy as ml_dtypes' types, one element a byte."""
import ml_dtypes
import numpy as np
import onnx.numpy_helper
import pytest

import kiln
from conftest import cuda_available

KINDS = [
    (kiln.f8e8m0fnu, ml_dtypes.float8_e8m0fnu),
    (kiln.f4e2m1fn, ml_dtypes.float4_e2m1fn),
    (kiln.i4, ml_dtypes.int4),
    (kiln.u4, ml_dtypes.uint4),
    (kiln.i2, ml_dtypes.int2),
    (kiln.u2, ml_dtypes.uint2),
]
IDS = [k.name for k, _ in KINDS]
INTS = {kiln.i4: (-8, 7), kiln.u4: (0, 15), kiln.i2: (-2, 1), kiln.u2: (0, 3)}
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not cuda_available(), reason="no CUDA device"))]


def run(device, fn, x):
    g = kiln.Graph()
    t = g.placeholder(list(x.shape), kiln.dtype(x.dtype), "x")
    out = g.compile([fn(t)], device=device).run({t: x})[0]
    return out.numpy()


def codes_of(kind):
    """Every code of a kind, as its ml_dtypes array."""
    n = 256 if kind == kiln.f8e8m0fnu else 16 if kind == kiln.f4e2m1fn else \
        1 << (4 if kind in (kiln.i4, kiln.u4) else 2)
    return np.arange(n, dtype=np.uint8)


def probes(rng, kind, ml, dtype):
    """The kind's values, the midpoints between neighbours (ties) and the numbers next to them,
    values past the range, specials, random values; both signs."""
    values = np.unique(np.abs(codes_of(kind).view(ml).astype(np.float64)))
    values = values[np.isfinite(values)]
    mids = (values[:-1] + values[1:]) / 2
    with np.errstate(over="ignore"):
        x = np.concatenate([values, mids, np.nextafter(mids, np.inf), np.nextafter(mids, 0),
                            values * 1.5, [values[-1] * 3, 1e30, np.inf, np.nan, 0.0],
                            rng.uniform(-20, 20, 2000),
                            np.exp2(rng.uniform(-30, 30, 2000))]).astype(dtype)
    return np.concatenate([x, -x])


def reference(x, kind, ml, saturate=True, round_mode="up"):
    if kind == kiln.f8e8m0fnu:
        with np.errstate(over="ignore"):  # (f64 values past f32's range become infinities)
            x32 = x.astype(np.float32)
        return onnx.numpy_helper.to_float8e8m0(np.abs(x32), saturate, round_mode).view(np.uint8)
    if kind == kiln.f4e2m1fn:
        want = x.astype(ml).view(np.uint8)
        return np.where(np.isnan(x), np.uint8(7), want)  # (ONNX: NaN gives 6)
    lo, hi = INTS[kind]
    with np.errstate(invalid="ignore"):
        r = np.clip(np.rint(np.nan_to_num(x.astype(np.float64), nan=0.0)), lo, hi)
    return r.astype(np.int64).astype(np.uint8) & np.uint8((hi - lo))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind,ml", KINDS, ids=IDS)
def test_every_code_decodes_as_ml_dtypes(device, kind, ml):
    codes = codes_of(kind).view(ml)
    for to, np_to in [(kiln.f32, np.float32), (kiln.f64, np.float64)]:
        got = run(device, lambda t: kiln.cast(t, to), codes)
        assert got.dtype == np_to
        np.testing.assert_array_equal(got, codes.astype(np_to))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind,ml", KINDS, ids=IDS)
@pytest.mark.parametrize("src", [np.float32, np.float64, np.float16])
def test_rounding(device, kind, ml, src):
    rng = np.random.default_rng(7)
    x = probes(rng, kind, ml, src)
    got = run(device, lambda t: kiln.cast(t, kind), x)
    assert got.dtype == ml
    # (f8e8m0fnu drops the sign: ONNX leaves negative values undefined)
    np.testing.assert_array_equal(got.view(np.uint8), reference(x, kind, ml))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [True, False])
def test_e8m0_rounding_modes(device, round_mode, saturate):
    rng = np.random.default_rng(11)
    with np.errstate(over="ignore"):
        x = np.concatenate([np.exp2(rng.uniform(-149, 128, 3000)),
                            np.exp2(np.arange(-149.0, 128.0)) * 1.5,
                            np.exp2(np.arange(-149.0, 128.0)) * 1.25,
                            [3.4e38, 1.5, 0.75, 0.0, 1e-40, np.inf, np.nan]]).astype(np.float32)
    got = run(device, lambda t: kiln.cast(t, kiln.f8e8m0fnu, saturate, round_mode), x)
    np.testing.assert_array_equal(got.view(np.uint8),
                                  reference(x, kiln.f8e8m0fnu, None, saturate, round_mode))
    with pytest.raises(kiln.ValueError, match="round must be"):
        kiln.cast(kiln.Graph().placeholder([1], kiln.f32, "x"), kiln.f8e8m0fnu, round="sideways")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind,ml", KINDS, ids=IDS)
def test_from_integers(device, kind, ml):
    x = np.array([0, 1, -1, 2, -2, 3, 7, -8, 8, -9, 15, 16, 100, -100, 2**31 - 1, -2**31],
                 dtype=np.int32)
    got = run(device, lambda t: kiln.cast(t, kind), x)
    np.testing.assert_array_equal(got.view(np.uint8), reference(x.astype(np.float64), kind, ml))


@pytest.mark.parametrize("kind,ml", KINDS, ids=IDS)
def test_numpy_round_trip_and_dtype(kind, ml):
    assert kind.is_narrow and not kind.is_integer and not kind.is_floating
    assert kind.itemsize == 1
    assert kind.numpy == np.dtype(ml)
    assert kiln.dtype(np.dtype(ml)) == kind
    codes = codes_of(kind).view(ml)
    a = kiln.Array(codes)
    assert a.dtype == kind
    back = a.numpy()
    assert back.dtype == ml
    np.testing.assert_array_equal(back.view(np.uint8), codes.view(np.uint8))
    with pytest.raises(kiln.DTypeError, match="DLPack"):
        a.__dlpack__()


def test_arithmetic_on_a_narrow_type_names_it():
    g = kiln.Graph()
    t = g.placeholder([4], kiln.i4, "x")
    with pytest.raises(kiln.Error, match="i4"):
        g.compile([kiln.add(t, t)], device="cpu")
