"""Core ML import of MIL's neural network ops (src/io/coreml/ops_nn.cpp): linear, matmul, einsum,
conv and conv_transpose (1-d to 3-d, every pad_type, strides, dilations, groups, output_shape),
max/avg/l2 pooling (pad types, ceil_mode, exclude_padding_from_average), batch, instance, layer,
l2 and local response normalization, the upsample, resize and resample ops, and iOS18's
scaled_dot_product_attention. Each test builds a one-op program on fresh random data, runs it
with kiln on the CPU and compares with a float64 numpy reference written here from the op's
definition in coremltools (fp32 to rtol 1e-4, fp16 to 1e-2, int32 exactly); parameter values
kiln does not take must fail on import with a ValueError naming the parameter. A conv also runs
on an input of enumerated shapes, whose sizes bound the feeds."""
import math
import warnings

import numpy as np
import pytest

import kiln
from coreml_util import IOS15, IOS16, IOS17, IOS18, check, ct, mb, program, randn, run, save
from coremltools.converters.mil.mil import get_new_symbol


def same_pads(size, k, s, d=1, lower=False):
    """MIL's pad_type same (odd pixel at the end) or same_lower: out = ceil(size / s)."""
    out = -(-size // s)
    total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
    small = total // 2
    return (total - small, small) if lower else (small, total - small)


def pads_of(pad_type, pad, spatial, kernel, strides, dilations):
    """(begin, end) per spatial dim for a conv or pool's pad_type."""
    if pad_type == "valid":
        return [(0, 0)] * len(spatial)
    if pad_type == "custom":
        return [(pad[2 * i], pad[2 * i + 1]) for i in range(len(spatial))]
    return [same_pads(n, k, s, d, pad_type == "same_lower")
            for n, k, s, d in zip(spatial, kernel, strides, dilations)]


def conv_ref(x, w, b, strides, pads, dilations, groups):
    """Direct N-d cross-correlation: w (O, C / groups, kernel...), pads (begin, end) per dim."""
    x = np.pad(x.astype(np.float64), [(0, 0), (0, 0)] + list(pads))
    w = w.astype(np.float64)
    nd, cout, kernel = x.ndim - 2, w.shape[0], w.shape[2:]
    cg, og = x.shape[1] // groups, cout // groups
    out = [(x.shape[2 + i] - (kernel[i] - 1) * dilations[i] - 1) // strides[i] + 1
           for i in range(nd)]
    y = np.zeros((x.shape[0], cout, *out))
    for off in np.ndindex(*kernel):
        sl = tuple(slice(off[i] * dilations[i], off[i] * dilations[i] + (out[i] - 1) * strides[i]
                         + 1, strides[i]) for i in range(nd))
        patch = x[(slice(None), slice(None)) + sl]
        for g in range(groups):
            y[:, g * og:(g + 1) * og] += np.einsum(
                "nc...,oc->no...", patch[:, g * cg:(g + 1) * cg], w[g * og:(g + 1) * og, :, *off])
    if b is not None:
        y += b.astype(np.float64).reshape((1, -1) + (1,) * nd)
    return y


def conv_transpose_ref(x, w, b, strides, pads, dilations, groups, out=None):
    """Each input element scatters w (C, O / groups, kernel...) times itself; the full result is
    cropped by pads (begin, end) and then cut or zero-extended at the end to `out`."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    nd, spatial, kernel = x.ndim - 2, x.shape[2:], w.shape[2:]
    cg, og = x.shape[1] // groups, w.shape[1]
    full = [(spatial[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 for i in range(nd)]
    y = np.zeros((x.shape[0], og * groups, *full))
    for off in np.ndindex(*kernel):
        sl = tuple(slice(off[i] * dilations[i], off[i] * dilations[i] + (spatial[i] - 1)
                         * strides[i] + 1, strides[i]) for i in range(nd))
        for g in range(groups):
            y[(slice(None), slice(g * og, (g + 1) * og)) + sl] += np.einsum(
                "nc...,co->no...", x[:, g * cg:(g + 1) * cg], w[g * cg:(g + 1) * cg, :, *off])
    y = y[(slice(None), slice(None)) + tuple(slice(p[0], f - p[1]) for p, f in zip(pads, full))]
    if out is not None:
        r = np.zeros(y.shape[:2] + tuple(out))
        keep = tuple(slice(0, min(o, n)) for o, n in zip(out, y.shape[2:]))
        r[(slice(None), slice(None)) + keep] = y[(slice(None), slice(None)) + keep]
        y = r
    if b is not None:
        y += b.astype(np.float64).reshape((1, -1) + (1,) * nd)
    return y


def pool_ref(x, kind, kernel, strides, pads, ceil_mode=False, exclude=False):
    """max, avg or l2 pooling with MIL's output sizes; an average's divisor counts the window
    inside the padded input (or inside the input alone when `exclude`), as PyTorch's."""
    x = x.astype(np.float64)
    spatial = x.shape[2:]
    out = []
    for n, k, s, (pb, pe) in zip(spatial, kernel, strides, pads):
        if ceil_mode:
            o = math.ceil((n + pb + pe - k) / s) + 1
            if pb + pe > 0 and (o - 1) * s >= n + (pb + pe) / 2:
                o -= 1
        else:
            o = (n + pb + pe - k) // s + 1
        out.append(o)
    y = np.zeros(x.shape[:2] + tuple(out))
    for idx in np.ndindex(*out):
        starts = [i * s - p[0] for i, s, p in zip(idx, strides, pads)]
        lo = [max(0, a) for a in starts]
        hi = [min(a + k, n) for a, k, n in zip(starts, kernel, spatial)]
        win = x[(slice(None), slice(None)) + tuple(slice(a, b) for a, b in zip(lo, hi))]
        axes = tuple(range(2, x.ndim))
        if kind == "max":
            v = win.max(axis=axes)
        elif kind == "l2":
            v = np.sqrt((win * win).sum(axis=axes))
        else:
            ends = [min(a + k, n + p[1]) for a, k, n, p in zip(starts, kernel, spatial, pads)]
            count = np.prod([b - a for a, b in zip(lo, hi)] if exclude else
                            [b - a for a, b in zip(starts, ends)])
            v = win.sum(axis=axes) / count
        y[(slice(None), slice(None)) + idx] = v
    return y


def lerp_ref(x, axis, pts):
    """x interpolated linearly along `axis` at coordinates pts (within [0, n - 1])."""
    lo = np.floor(pts).astype(int)
    hi = np.minimum(lo + 1, x.shape[axis] - 1)
    shape = [1] * x.ndim
    shape[axis] = len(pts)
    f = (pts - lo).reshape(shape)
    return np.take(x, lo, axis) * (1 - f) + np.take(x, hi, axis) * f


def softmax(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# ---- linear, matmul, einsum ----


@pytest.mark.parametrize("x_shape", [(5,), (3, 5), (2, 3, 5)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear(tmp_path, rng, x_shape, bias):
    w, b = randn(rng, 4, 5), randn(rng, 4)

    @program((x_shape, np.float32))
    def prog(x):
        return mb.linear(x=x, weight=w, bias=b) if bias else mb.linear(x=x, weight=w)

    x = randn(rng, *x_shape)
    want = x.astype(np.float64) @ w.T.astype(np.float64) + (b if bias else 0)
    check(tmp_path, prog, {"x": x}, [want])


@pytest.mark.parametrize("x_shape, y_shape, tx, ty", [
    ((3, 4), (4, 5), False, False),
    ((4, 3), (4, 5), True, False),
    ((2, 3, 4), (5, 4), False, True),
    ((2, 1, 4, 3), (3, 5, 4), True, True),
    ((4,), (2, 4, 3), False, False),
])
def test_matmul(tmp_path, rng, x_shape, y_shape, tx, ty):
    @program((x_shape, np.float32), (y_shape, np.float32))
    def prog(x, y):
        return mb.matmul(x=x, y=y, transpose_x=tx, transpose_y=ty)

    x, y = randn(rng, *x_shape), randn(rng, *y_shape)
    xs = np.swapaxes(x, -1, -2) if tx else x
    ys = np.swapaxes(y, -1, -2) if ty else y
    want = np.asarray(np.matmul(xs.astype(np.float64), ys.astype(np.float64)))
    check(tmp_path, prog, {"x": x, "y": y}, [want])


def test_matmul_fp16(tmp_path, rng):
    @program(((2, 8, 16), np.float16), ((2, 8, 16), np.float16))
    def prog(x, y):
        return mb.matmul(x=x, y=y, transpose_y=True)

    x, y = randn(rng, 2, 8, 16, dtype=np.float16), randn(rng, 2, 8, 16, dtype=np.float16)
    want = x.astype(np.float64) @ np.swapaxes(y.astype(np.float64), -1, -2)
    check(tmp_path, prog, {"x": x, "y": y}, [want], rtol=1e-2, atol=2e-2)


def test_linear_and_matmul_int32(tmp_path, rng):
    w, b = rng.integers(-5, 6, (4, 3)).astype(np.int32), rng.integers(-5, 6, 4).astype(np.int32)

    @program(((2, 3), np.int32), ((3, 5), np.int32))
    def prog(x, y):
        return mb.linear(x=x, weight=w, bias=b), mb.matmul(x=x, y=y)

    x = rng.integers(-9, 10, (2, 3)).astype(np.int32)
    y = rng.integers(-9, 10, (3, 5)).astype(np.int32)
    check(tmp_path, prog, {"x": x, "y": y}, [x.astype(np.int64) @ w.T + b, x.astype(np.int64) @ y],
          rtol=0, atol=0)


@pytest.mark.parametrize("equation, x_shape, y_shape", [
    ("nchw,nwhu->nchu", (2, 3, 4, 5), (2, 5, 4, 6)),
    ("abcd,adce->abce", (1, 3, 4, 5), (2, 5, 1, 6)),  # batch and h broadcast
    ("chw,whr->chr", (3, 4, 5), (5, 4, 2)),
])
def test_einsum(tmp_path, rng, equation, x_shape, y_shape):
    @program((x_shape, np.float32), (y_shape, np.float32))
    def prog(x, y):
        return mb.einsum(values=(x, y), equation=equation)

    x, y = randn(rng, *x_shape), randn(rng, *y_shape)
    if len(x_shape) == 4:
        b, h = max(x_shape[0], y_shape[0]), max(x_shape[2], y_shape[2])
        xb = np.broadcast_to(x, (b, x_shape[1], h, x_shape[3]))
        yb = np.broadcast_to(y, (b, y_shape[1], h, y_shape[3]))
    else:
        xb, yb = x, y
    want = np.einsum(equation, xb.astype(np.float64), yb.astype(np.float64))
    check(tmp_path, prog, {"x": x, "y": y}, [want])


# ---- convolution ----

CONV_CASES = [
    # spatial, kernel, strides, pad_type, pad, dilations, groups
    ((9,), (3,), (1,), "valid", None, (1,), 1),
    ((10,), (4,), (2,), "same", None, (1,), 2),
    ((7, 8), (3, 3), (1, 1), "same", None, (1, 1), 1),
    ((7, 8), (2, 4), (2, 3), "same", None, (1, 1), 1),
    ((7, 8), (2, 4), (2, 3), "same_lower", None, (1, 1), 1),
    ((7, 8), (3, 2), (1, 1), "same_lower", None, (2, 3), 1),
    ((7, 8), (3, 2), (2, 1), "custom", (1, 0, 2, 1), (2, 1), 2),
    ((6, 7), (3, 3), (1, 2), "valid", None, (2, 2), 4),
    ((5, 6, 4), (3, 2, 2), (1, 2, 1), "custom", (1, 1, 0, 1, 1, 0), (1, 1, 2), 1),
    ((5, 6, 4), (2, 3, 2), (2, 1, 1), "same", None, (1, 1, 1), 2),
]


@pytest.mark.parametrize("spatial, kernel, strides, pad_type, pad, dilations, groups", CONV_CASES)
def test_conv(tmp_path, rng, spatial, kernel, strides, pad_type, pad, dilations, groups):
    x_shape = (2, 4) + spatial
    w, b = randn(rng, 8, 4 // groups, *kernel), randn(rng, 8)
    extra = {"pad": list(pad)} if pad_type == "custom" else {}

    @program((x_shape, np.float32))
    def prog(x):
        return mb.conv(x=x, weight=w, bias=b, strides=list(strides), pad_type=pad_type,
                       dilations=list(dilations), groups=groups, **extra)

    x = randn(rng, *x_shape)
    pads = pads_of(pad_type, pad, spatial, kernel, strides, dilations)
    check(tmp_path, prog, {"x": x}, [conv_ref(x, w, b, strides, pads, dilations, groups)])


def test_conv_computed_weight(tmp_path, rng):
    # a weight that is a program input, not a const; no bias
    @program(((1, 3, 6, 6), np.float32), ((5, 3, 3, 3), np.float32))
    def prog(x, w):
        return mb.conv(x=x, weight=w, strides=[2, 1], pad_type="same")

    x, w = randn(rng, 1, 3, 6, 6), randn(rng, 5, 3, 3, 3)
    pads = pads_of("same", None, (6, 6), (3, 3), (2, 1), (1, 1))
    check(tmp_path, prog, {"x": x, "w": w}, [conv_ref(x, w, None, (2, 1), pads, (1, 1), 1)])


def test_conv_fp16(tmp_path, rng):
    w, b = randn(rng, 6, 4, 3, 3, dtype=np.float16), randn(rng, 6, dtype=np.float16)

    @program(((1, 4, 8, 8), np.float16))
    def prog(x):
        return mb.conv(x=x, weight=w, bias=b, pad_type="same")

    x = randn(rng, 1, 4, 8, 8, dtype=np.float16)
    want = conv_ref(x, w, b, (1, 1), [(1, 1), (1, 1)], (1, 1), 1)
    check(tmp_path, prog, {"x": x}, [want], rtol=1e-2, atol=3e-2)


def test_conv_fp16_weight_fp32_input(tmp_path, rng):
    # iOS17 lets the weight and bias have their own dtype
    w, b = randn(rng, 6, 4, 3, dtype=np.float16), randn(rng, 6, dtype=np.float16)

    @program(((2, 4, 9), np.float32), target=IOS17)
    def prog(x):
        return mb.conv(x=x, weight=w, bias=b, pad_type="valid")

    x = randn(rng, 2, 4, 9)
    want = conv_ref(x, w, b, (1,), [(0, 0)], (1,), 1)
    check(tmp_path, prog, {"x": x}, [want], target=IOS17, rtol=1e-3, atol=1e-3)


def test_conv_enumerated_input_shapes(tmp_path, rng):
    # an input of enumerated shapes: kiln holds each flexible dim to the smallest and largest of
    # its enumerated sizes (docs/coreml.md), so a size between them runs too
    w, b = randn(rng, 5, 3, 3, 3), randn(rng, 5)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 3, get_new_symbol(), get_new_symbol()))],
                opset_version=IOS16)
    def prog(x):
        return mb.conv(x=x, weight=w, bias=b, strides=[1, 2], pad_type="same")

    sizes = [(8, 8), (16, 12), (32, 32)]
    shapes = ct.EnumeratedShapes(shapes=[(1, 3) + s for s in sizes], default=(1, 3, 8, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mm = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=IOS16,
                        inputs=[ct.TensorType(name="x", shape=shapes)],
                        pass_pipeline=ct.PassPipeline.EMPTY)
    path = str(tmp_path / "m.mlpackage")
    mm.save(path)
    assert len(mm.get_spec().description.input[0].type.multiArrayType.enumeratedShapes.shapes) == 3
    m = kiln.coreml.load(path)
    assert list(m.inputs[0].shape) == [1, 3, -1, -1]
    exe = m.compile(device="cpu")

    def want(x):
        pads = pads_of("same", None, x.shape[2:], (3, 3), (1, 2), (1, 1))
        return conv_ref(x, w, b, (1, 2), pads, (1, 1), 1)

    for hw in [sizes[0], sizes[1], (10, 20)]:  # two enumerated sizes, one within their range
        x = randn(rng, 1, 3, *hw)
        np.testing.assert_allclose(exe.run({"x": x})[0].numpy(), want(x), rtol=1e-4, atol=1e-5)
    for hw, bad in [((4, 8), r"dim 2 must be in \[8, 32\] but the feed has 4"),
                    ((8, 40), r"dim 3 must be in \[8, 32\] but the feed has 40")]:
        with pytest.raises(kiln.ShapeError, match=r"input 'x' " + bad):
            exe.run({"x": randn(rng, 1, 3, *hw)})
    # input_shapes fixes the dims to one size in the range; one outside fails on import
    x = randn(rng, 1, 3, 16, 12)
    (got,) = run(path, {"x": x}, input_shapes={"x": [1, 3, 16, 12]})
    np.testing.assert_allclose(got, want(x), rtol=1e-4, atol=1e-5)
    with pytest.raises(kiln.ShapeError, match="input 'x'.*ranges"):
        kiln.coreml.load(path, input_shapes={"x": [1, 3, 64, 12]})


CONV_TRANSPOSE_CASES = [
    # spatial, kernel, strides, pad_type, pad, dilations, groups, output spatial sizes
    ((5,), (3,), (2,), "valid", None, (1,), 1, None),
    ((4, 5), (3, 3), (2, 2), "custom", (1, 0, 1, 1), (1, 1), 2, None),
    ((4, 5), (3, 2), (2, 3), "same", None, (1, 1), 1, None),
    ((4, 5), (2, 2), (3, 3), "same", None, (1, 1), 1, None),  # kernel < stride
    ((4, 5), (3, 3), (2, 2), "valid", None, (2, 1), 1, (12, 12)),
    ((4, 5), (3, 3), (2, 2), "same", None, (1, 1), 1, (8, 9)),
    ((3, 4, 3), (2, 3, 2), (1, 2, 2), "custom", (0, 1, 1, 1, 0, 0), (1, 1, 1), 1, None),
]


@pytest.mark.parametrize("spatial, kernel, strides, pad_type, pad, dilations, groups, out",
                         CONV_TRANSPOSE_CASES)
def test_conv_transpose(tmp_path, rng, spatial, kernel, strides, pad_type, pad, dilations,
                        groups, out):
    x_shape = (2, 4) + spatial
    w, b = randn(rng, 4, 3, *kernel), randn(rng, 3 * groups)
    extra = {"pad": list(pad)} if pad_type == "custom" else {}
    if out is not None:
        extra["output_shape"] = [2, 3 * groups] + list(out)

    @program((x_shape, np.float32))
    def prog(x):
        return mb.conv_transpose(x=x, weight=w, bias=b, strides=list(strides), pad_type=pad_type,
                                 dilations=list(dilations), groups=groups, **extra)

    x = randn(rng, *x_shape)
    full = [(n - 1) * s + (k - 1) * d + 1
            for n, k, s, d in zip(spatial, kernel, strides, dilations)]
    if pad_type == "custom":
        pads = [(pad[2 * i], pad[2 * i + 1]) for i in range(len(spatial))]
    elif pad_type == "valid":
        pads = [(0, 0)] * len(spatial)
    else:  # same: out = in * stride (or output_shape), the odd pixel cropped at the end
        target = out or [n * s for n, s in zip(spatial, strides)]
        pads = [(max(0, f - t) // 2, max(0, f - t) - max(0, f - t) // 2)
                for f, t in zip(full, target)]
        out = target
    want = conv_transpose_ref(x, w, b, strides, pads, dilations, groups, out)
    check(tmp_path, prog, {"x": x}, [want])


# ---- pooling ----

POOL_CASES = [
    # spatial, kernel, strides, pad_type, pad, ceil_mode
    ((8,), (3,), (2,), "valid", None, False),
    ((9,), (3,), (2,), "same", None, False),
    ((7, 9), (2, 2), (2, 2), "valid", None, False),
    ((7, 9), (3, 3), (2, 2), "same", None, False),
    ((7, 8), (2, 3), (1, 2), "same_lower", None, False),
    ((7, 8), (3, 3), (2, 1), "custom", (1, 0, 0, 1), False),
    ((7, 8), (3, 3), (2, 2), "custom", (1, 1, 1, 1), True),
    ((7, 9), (2, 3), (2, 2), "valid", None, True),
    ((5, 6, 7), (2, 3, 2), (2, 1, 2), "custom", (1, 0, 1, 1, 0, 1), False),
]


def pool_case(tmp_path, rng, op, case, dtype=np.float32, **kw):
    spatial, kernel, strides, pad_type, pad, ceil_mode = case
    x_shape = (2, 3) + spatial
    extra = {"pad": list(pad)} if pad_type == "custom" else {}

    @program((x_shape, dtype))
    def prog(x):
        return getattr(mb, op)(x=x, kernel_sizes=list(kernel), strides=list(strides),
                               pad_type=pad_type, ceil_mode=ceil_mode, **extra, **kw)

    x = randn(rng, *x_shape, dtype=dtype)
    pads = pads_of(pad_type, pad, spatial, kernel, strides, (1,) * len(spatial))
    return prog, x, (kernel, strides, pads, ceil_mode)


@pytest.mark.parametrize("case", POOL_CASES)
def test_max_pool(tmp_path, rng, case):
    prog, x, (k, s, pads, ceil_mode) = pool_case(tmp_path, rng, "max_pool", case)
    check(tmp_path, prog, {"x": x}, [pool_ref(x, "max", k, s, pads, ceil_mode)])


@pytest.mark.parametrize("case", POOL_CASES)
@pytest.mark.parametrize("exclude", [False, True])
def test_avg_pool(tmp_path, rng, case, exclude):
    prog, x, (k, s, pads, ceil_mode) = pool_case(tmp_path, rng, "avg_pool", case,
                                                 exclude_padding_from_average=exclude)
    check(tmp_path, prog, {"x": x}, [pool_ref(x, "avg", k, s, pads, ceil_mode, exclude)])


@pytest.mark.parametrize("case", [c for c in POOL_CASES if len(c[0]) <= 2])
def test_l2_pool(tmp_path, rng, case):
    prog, x, (k, s, pads, ceil_mode) = pool_case(tmp_path, rng, "l2_pool", case)
    check(tmp_path, prog, {"x": x}, [pool_ref(x, "l2", k, s, pads, ceil_mode)])


def test_avg_pool_fp16(tmp_path, rng):
    case = POOL_CASES[3]
    prog, x, (k, s, pads, _) = pool_case(tmp_path, rng, "avg_pool", case, dtype=np.float16)
    check(tmp_path, prog, {"x": x}, [pool_ref(x, "avg", k, s, pads)], rtol=1e-2, atol=1e-2)


# ---- normalization ----


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 3, 2, 3, 4)])
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm(tmp_path, rng, shape, affine):
    c = shape[1]
    mean, var = randn(rng, c), rng.uniform(0.5, 2.0, c).astype(np.float32)
    gamma, beta = randn(rng, c), randn(rng, c)
    extra = {"gamma": gamma, "beta": beta} if affine else {}

    @program((shape, np.float32))
    def prog(x):
        return mb.batch_norm(x=x, mean=mean, variance=var, epsilon=1e-3, **extra)

    x = randn(rng, *shape)
    per = (1, c) + (1,) * (len(shape) - 2)
    want = (x - mean.reshape(per)) / np.sqrt(var.astype(np.float64).reshape(per) + 1e-3)
    if affine:
        want = want * gamma.reshape(per) + beta.reshape(per)
    check(tmp_path, prog, {"x": x}, [want])


@pytest.mark.parametrize("shape", [(2, 3, 7), (2, 3, 4, 5)])
def test_instance_norm(tmp_path, rng, shape):
    gamma, beta = randn(rng, shape[1]), randn(rng, shape[1])

    @program((shape, np.float32))
    def prog(x):
        return mb.instance_norm(x=x, gamma=gamma, beta=beta, epsilon=1e-4)

    x = randn(rng, *shape)
    axes = tuple(range(2, len(shape)))
    xd = x.astype(np.float64)
    per = (1, -1) + (1,) * (len(shape) - 2)
    want = ((xd - xd.mean(axis=axes, keepdims=True))
            / np.sqrt(xd.var(axis=axes, keepdims=True) + 1e-4))
    check(tmp_path, prog, {"x": x}, [want * gamma.reshape(per) + beta.reshape(per)])


def layer_norm_ref(x, axes, gamma, beta, eps):
    x = x.astype(np.float64)
    axes = sorted(a % x.ndim for a in axes)
    d = x - x.mean(axis=tuple(axes), keepdims=True)
    y = d / np.sqrt((d * d).mean(axis=tuple(axes), keepdims=True) + eps)
    shape = [x.shape[i] if i in axes else 1 for i in range(x.ndim)]
    if gamma is not None:
        y = y * gamma.reshape(shape)
    if beta is not None:
        y = y + beta.reshape(shape)
    return y


@pytest.mark.parametrize("axes", [[-1], [2, 3], [1, 3], [0, 2], [3, -3], [0, 1, 2, 3]])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(tmp_path, rng, axes, affine):
    shape = (2, 3, 4, 5)
    norm = sorted(a % 4 for a in axes)
    gamma = randn(rng, *[shape[a] for a in norm]) if affine else None
    beta = randn(rng, *[shape[a] for a in norm]) if affine else None
    extra = {"gamma": gamma, "beta": beta} if affine else {}

    @program((shape, np.float32))
    def prog(x):
        return mb.layer_norm(x=x, axes=axes, epsilon=1e-5, **extra)

    x = randn(rng, *shape)
    want = layer_norm_ref(x, norm, gamma, beta, 1e-5)
    check(tmp_path, prog, {"x": x}, [want])


def test_layer_norm_fp16(tmp_path, rng):
    gamma, beta = randn(rng, 16, dtype=np.float16), randn(rng, 16, dtype=np.float16)

    @program(((2, 5, 16), np.float16))
    def prog(x):
        return mb.layer_norm(x=x, axes=[-1], gamma=gamma, beta=beta, epsilon=np.float16(1e-5))

    x = randn(rng, 2, 5, 16, dtype=np.float16)
    want = layer_norm_ref(x, [2], gamma, beta, 1e-5)
    check(tmp_path, prog, {"x": x}, [want], rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize("shape", [(3, 4, 5), (2, 3, 4, 5), (2, 2, 3, 4, 2)])
def test_l2_norm(tmp_path, rng, shape):
    @program((shape, np.float32))
    def prog(x):
        return mb.l2_norm(x=x, epsilon=1e-3)

    x = randn(rng, *shape)
    xd = x.astype(np.float64)
    ss = (xd * xd).sum(axis=(-3, -2, -1), keepdims=True)
    check(tmp_path, prog, {"x": x}, [xd / np.sqrt(ss + 1e-3)])


@pytest.mark.parametrize("shape", [(2, 6, 5), (2, 7, 3, 4), (1, 5, 2, 3, 2)])
@pytest.mark.parametrize("size", [2, 3, 5])
def test_local_response_norm(tmp_path, rng, shape, size):
    alpha, beta, k = 0.5, 0.75, 2.0

    @program((shape, np.float32))
    def prog(x):
        return mb.local_response_norm(x=x, size=size, alpha=alpha, beta=beta, k=k)

    x = randn(rng, *shape)
    xd = x.astype(np.float64)
    want = np.empty_like(xd)
    for c in range(shape[1]):
        lo, hi = max(0, c - size // 2), min(shape[1], c + (size - 1) // 2 + 1)
        s = (xd[:, lo:hi] ** 2).sum(axis=1)
        want[:, c] = xd[:, c] / (k + alpha / size * s) ** beta
    check(tmp_path, prog, {"x": x}, [want])


# ---- resizing ----


@pytest.mark.parametrize("sh, sw", [(2, 3), (1.5, 2.5), (1.0, 0.5)])
def test_upsample_nearest_neighbor(tmp_path, rng, sh, sw):
    @program(((2, 3, 4, 6), np.float32))
    def prog(x):
        return mb.upsample_nearest_neighbor(x=x, scale_factor_height=sh, scale_factor_width=sw)

    x = randn(rng, 2, 3, 4, 6)
    h, w = int(math.floor(4 * sh)), int(math.floor(6 * sw))
    rows = np.minimum(np.floor(np.arange(h) / sh).astype(int), 3)
    cols = np.minimum(np.floor(np.arange(w) / sw).astype(int), 5)
    want = x.astype(np.float64)[:, :, rows][:, :, :, cols]
    check(tmp_path, prog, {"x": x}, [want])


def bilinear_grid(mode, n_in, n_out):
    """resize_bilinear's sampling grid, as coremltools documents each sampling_mode."""
    i = np.arange(n_out, dtype=np.float64)
    if mode in ("STRICT_ALIGN_CORNERS", "ALIGN_CORNERS"):
        if n_out == 1:
            p = np.array([(n_in - 1) / 2 if mode == "ALIGN_CORNERS" else 0.0])
        else:
            p = i * (n_in - 1) / (n_out - 1)
    elif mode == "DEFAULT":
        p = i * (n_in - n_in / n_out) / (n_out - 1) if n_out > 1 else i
    elif mode == "OFFSET_CORNERS":
        delta = max(1, n_in - 1) / n_out
        p = 0.5 * delta + i * delta
    else:  # UNALIGN_CORNERS
        spacing = n_in / n_out
        p = i * spacing + 0.5 * spacing - 0.5
    return np.clip(p, 0, n_in - 1)


@pytest.mark.parametrize("align, half, target", [
    (True, None, IOS15), (False, None, IOS15), (False, True, IOS16), (False, False, IOS16)])
@pytest.mark.parametrize("sh, sw", [(2, 3), (1.5, 2.0)])
def test_upsample_bilinear(tmp_path, rng, align, half, target, sh, sw):
    extra = {} if half is None else {"half_pixel_centers": half}

    @program(((2, 3, 4, 5), np.float32), target=target)
    def prog(x):
        return mb.upsample_bilinear(x=x, scale_factor_height=sh, scale_factor_width=sw,
                                    align_corners=align, **extra)

    x = randn(rng, 2, 3, 4, 5)
    half = (not align) if half is None else half
    mode = "ALIGN_CORNERS" if align else "UNALIGN_CORNERS" if half else "DEFAULT"
    h, w = int(math.floor(4 * sh)), int(math.floor(5 * sw))
    want = lerp_ref(x.astype(np.float64), 2, bilinear_grid(mode, 4, h))
    want = lerp_ref(want, 3, bilinear_grid(mode, 5, w))
    check(tmp_path, prog, {"x": x}, [want], target=target)


@pytest.mark.parametrize("mode", ["STRICT_ALIGN_CORNERS", "ALIGN_CORNERS", "DEFAULT",
                                  "OFFSET_CORNERS", "UNALIGN_CORNERS"])
@pytest.mark.parametrize("h, w", [(7, 9), (3, 1), (1, 2)])
def test_resize_bilinear(tmp_path, rng, mode, h, w):
    @program(((2, 4, 5), np.float32))
    def prog(x):
        return mb.resize_bilinear(x=x, target_size_height=h, target_size_width=w,
                                  sampling_mode=mode)

    x = randn(rng, 2, 4, 5)
    want = lerp_ref(x.astype(np.float64), 1, bilinear_grid(mode, 4, h))
    want = lerp_ref(want, 2, bilinear_grid(mode, 5, w))
    check(tmp_path, prog, {"x": x}, [want])


@pytest.mark.parametrize("h, w", [(8, 15), (3, 2), (6, 4)])
def test_resize_nearest_neighbor(tmp_path, rng, h, w):
    @program(((1, 2, 4, 5), np.float32))
    def prog(x):
        return mb.resize_nearest_neighbor(x=x, target_size_height=h, target_size_width=w)

    x = randn(rng, 1, 2, 4, 5)
    # (i + 0.5) * in / out, floored: TensorFlow's half-pixel nearest neighbour
    rows = np.minimum(np.floor((np.arange(h) + 0.5) * 4 / h).astype(int), 3)
    cols = np.minimum(np.floor((np.arange(w) + 0.5) * 5 / w).astype(int), 4)
    check(tmp_path, prog, {"x": x}, [x.astype(np.float64)[:, :, rows][:, :, :, cols]])


def grid_sample_ref(x, grid, mode, padding, align, fill=0.0):
    """PyTorch's grid_sample of x (B, C, H, W) at normalized (w, h) pairs grid (B, H', W', 2);
    padding constant reads `fill` outside, symmetric is PyTorch's reflection without
    align_corners."""
    x = x.astype(np.float64)
    b, _, h, w = x.shape

    def source(g, size):
        p = (g + 1) / 2 * (size - 1) if align else ((g + 1) * size - 1) / 2
        if padding == "border":
            return np.clip(p, 0, size - 1)
        if padding in ("reflection", "symmetric"):
            lo, span = (0.0, size - 1.0) if align else (-0.5, float(size))
            if span == 0:
                return np.zeros_like(p)
            d = np.abs(p - lo)
            extra, flips = np.fmod(d, span), np.floor(d / span)
            p = np.where(flips % 2 == 0, lo + extra, lo + span - extra)
            return np.clip(p, 0, size - 1)
        return p

    ix, iy = source(grid[..., 0].astype(np.float64), w), source(grid[..., 1].astype(np.float64), h)

    def tap(yy, xx):
        inside = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
        v = x[np.arange(b)[:, None, None], :, np.clip(yy, 0, h - 1), np.clip(xx, 0, w - 1)]
        return np.where(inside[:, None], np.moveaxis(v, -1, 1), fill)

    if mode == "nearest":
        return tap(np.rint(iy).astype(int), np.rint(ix).astype(int))
    x0, y0 = np.floor(ix).astype(int), np.floor(iy).astype(int)
    fx, fy = (ix - x0)[:, None], (iy - y0)[:, None]
    return (tap(y0, x0) * (1 - fx) * (1 - fy) + tap(y0, x0 + 1) * fx * (1 - fy)
            + tap(y0 + 1, x0) * (1 - fx) * fy + tap(y0 + 1, x0 + 1) * fx * fy)


@pytest.mark.parametrize("mode, padding, value, align, coords", [
    ("bilinear", "constant", 0.0, False, "normalized_minus_one_to_one"),
    ("bilinear", "constant", 1.5, True, "normalized_zero_to_one"),
    ("nearest", "border", 0.0, False, "normalized_minus_one_to_one"),
    ("bilinear", "reflection", 0.0, True, "normalized_minus_one_to_one"),
    ("bilinear", "symmetric", 0.0, False, "normalized_minus_one_to_one"),
    ("nearest", "symmetric", 0.0, False, "normalized_zero_to_one"),
    ("bilinear", "border", 0.0, True, "unnormalized"),
])
def test_resample(tmp_path, rng, mode, padding, value, align, coords):
    h, w = 4, 5

    @program(((2, 3, h, w), np.float32), ((2, 3, 6, 2), np.float32))
    def prog(x, g):
        return mb.resample(x=x, coordinates=g, sampling_mode=mode, padding_mode=padding,
                           padding_value=value, coordinates_mode=coords, align_corners=align)

    x = randn(rng, 2, 3, h, w)
    # coordinates reaching past the image on every side, and the same as [-1, 1] normalized
    g = rng.uniform(-1.4, 1.4, (2, 3, 6, 2)).astype(np.float32)
    norm = g.astype(np.float64)
    if coords == "normalized_zero_to_one":
        g = ((g + 1) / 2).astype(np.float32)
        norm = 2 * g.astype(np.float64) - 1
    elif coords == "unnormalized":
        size = np.array([w - 1, h - 1])
        g = ((g + 1) / 2 * size).astype(np.float32)
        norm = 2 * g.astype(np.float64) / size - 1
    want = grid_sample_ref(x, norm, mode, padding, align, value)
    check(tmp_path, prog, {"x": x, "g": g}, [want], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", ["upsample_nearest_neighbor", "resize_nearest_neighbor"])
def test_resize_dynamic_batch(tmp_path, rng, op):
    # a batch dim known only when the program runs: the output sizes are computed from x's shape
    @program(((get_new_symbol(), 2, 3, 4), np.float32))
    def prog(x):
        if op == "upsample_nearest_neighbor":
            return mb.upsample_nearest_neighbor(x=x, scale_factor_height=2, scale_factor_width=3)
        return mb.resize_nearest_neighbor(x=x, target_size_height=6, target_size_width=12)

    x = randn(rng, 5, 2, 3, 4)
    want = x.astype(np.float64)[:, :, np.arange(6) // 2][:, :, :, np.arange(12) // 3]
    check(tmp_path, prog, {"x": x}, [want])


# ---- attention ----


@pytest.mark.parametrize("mask", [None, "bool", "float"])
def test_scaled_dot_product_attention(tmp_path, rng, mask):
    specs = [((2, 3, 4, 8), np.float32), ((2, 3, 6, 8), np.float32), ((2, 3, 6, 5), np.float32)]
    q, k, v = randn(rng, 2, 3, 4, 8), randn(rng, 2, 3, 6, 8), randn(rng, 2, 3, 6, 5)
    feeds = {"q": q, "k": k, "v": v}
    bias = np.zeros((4, 6))
    if mask == "bool":  # a const: a program's inputs cannot be bool
        keep = rng.random((4, 6)) < 0.6
        keep[:, 0] = True  # every query sees a key
        bias = np.where(keep, 0.0, -np.inf)
    elif mask == "float":
        m = randn(rng, 3, 1, 6)
        bias = m.astype(np.float64)
        specs.append(((3, 1, 6), np.float32))
        feeds["m"] = m

    if mask is None:
        @program(*specs, target=IOS18)
        def prog(q, k, v):
            return mb.scaled_dot_product_attention(query=q, key=k, value=v)
    elif mask == "bool":
        @program(*specs, target=IOS18)
        def prog(q, k, v):
            return mb.scaled_dot_product_attention(query=q, key=k, value=v, attn_mask=keep)
    else:
        @program(*specs, target=IOS18)
        def prog(q, k, v, m):
            return mb.scaled_dot_product_attention(query=q, key=k, value=v, attn_mask=m)

    s = q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2) / np.sqrt(8) + bias
    want = softmax(s) @ v.astype(np.float64)
    check(tmp_path, prog, feeds, [want], target=IOS18)


# ---- parameters kiln does not take ----


def test_pool_pad_beyond_half_kernel_fails(tmp_path, rng):
    @program(((1, 2, 6, 6), np.float32))
    def prog(x):
        return mb.max_pool(x=x, kernel_sizes=[3, 3], strides=[1, 1], pad_type="custom",
                           pad=[2, 0, 0, 0])

    path = save(prog, tmp_path / "m.mlpackage")
    with pytest.raises(kiln.ValueError, match="'pad'"):
        run(path, {"x": randn(rng, 1, 2, 6, 6)})


def test_upsample_bilinear_align_and_half_pixel_fails(tmp_path, rng):
    @program(((1, 2, 3, 3), np.float32))
    def prog(x):
        return mb.upsample_bilinear(x=x, scale_factor_height=2, scale_factor_width=2,
                                    align_corners=True, half_pixel_centers=True)

    path = save(prog, tmp_path / "m.mlpackage")
    with pytest.raises(kiln.ValueError, match="half_pixel_centers"):
        run(path, {"x": randn(rng, 1, 2, 3, 3)})


def test_conv_transpose_unreachable_output_shape_fails(tmp_path, rng):
    w = randn(rng, 2, 3, 3, 3)

    @program(((1, 2, 4, 4), np.float32))
    def prog(x):
        return mb.conv_transpose(x=x, weight=w, strides=[2, 2], pad_type="valid",
                                 output_shape=[1, 3, 8, 9])

    path = save(prog, tmp_path / "m.mlpackage")
    with pytest.raises(kiln.ValueError, match="output_shape"):
        run(path, {"x": randn(rng, 1, 2, 4, 4)})


def test_resample_reflection_without_align_corners_fails(tmp_path, rng):
    @program(((1, 2, 3, 3), np.float32), ((1, 2, 2, 2), np.float32))
    def prog(x, g):
        return mb.resample(x=x, coordinates=g, sampling_mode="bilinear",
                           padding_mode="reflection", padding_value=0.0,
                           coordinates_mode="normalized_minus_one_to_one", align_corners=False)

    path = save(prog, tmp_path / "m.mlpackage")
    with pytest.raises(kiln.ValueError, match="padding_mode"):
        run(path, {"x": randn(rng, 1, 2, 3, 3), "g": randn(rng, 1, 2, 2, 2)})
