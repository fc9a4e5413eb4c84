"""Core ML import (kiln.coreml): ML Program packages made with coremltools' MIL builder, imported
and run by kiln against numpy references on fresh random data: the elementwise ops, activations,
softmax and reductions, compressed weights (quantized, palettized, sparse), fp16 programs, the
model's inputs, outputs and metadata, and the errors (unsupported ops listed together, bad
files, weight files outside the package)."""
import json
import math
import shutil
import warnings

import numpy as np
import pytest
from coreml_util import IOS16, IOS18, ct, mb, program, run, save

import kiln

F32 = np.float32

BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "real_div": np.divide,
    "maximum": np.maximum, "minimum": np.minimum, "pow": None,
    "equal": np.equal, "not_equal": np.not_equal, "less": np.less, "less_equal": np.less_equal,
    "greater": np.greater, "greater_equal": np.greater_equal,
}


@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_ops_broadcast(rng, tmp_path, op):
    @program(((2, 3, 4), F32), ((3, 1), F32))
    def prog(x, y):
        return getattr(mb, op)(x=x, y=y)

    x = rng.standard_normal((2, 3, 4)).astype(F32)
    y = rng.standard_normal((3, 1)).astype(F32)
    if op == "pow":
        x, want = np.abs(x) + 0.5, None
        want = np.power(np.abs(x).astype(np.float64), y)
    else:
        want = BINARY[op](x.astype(np.float64), y.astype(np.float64))
    (got,) = run(save(prog, tmp_path / "m.mlpackage"), {"x": x, "y": y})
    if want.dtype == bool:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["floor_div", "mod"])
def test_integer_floor_division_takes_the_divisor_sign(rng, tmp_path, op):
    @program(((6, 5), np.int32), ((6, 5), np.int32))
    def prog(x, y):
        return getattr(mb, op)(x=x, y=y)

    x = rng.integers(-50, 50, (6, 5)).astype(np.int32)
    y = rng.integers(1, 9, (6, 5)).astype(np.int32) * rng.choice([-1, 1], (6, 5)).astype(np.int32)
    want = np.floor_divide(x, y) if op == "floor_div" else np.mod(x, y)
    (got,) = run(save(prog, tmp_path / "m.mlpackage"), {"x": x, "y": y})
    np.testing.assert_array_equal(got, want)


def _gelu(x, mode):
    if mode == "EXACT":
        return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    if mode == "TANH_APPROXIMATION":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return x / (1 + np.exp(-1.702 * x))


UNARY = {
    "abs": np.abs, "ceil": np.ceil, "floor": np.floor, "round": np.round, "sign": np.sign,
    "exp": np.exp, "exp2": np.exp2, "sin": np.sin, "cos": np.cos, "tan": np.tan, "tanh": np.tanh,
    "sinh": np.sinh, "cosh": np.cosh, "atan": np.arctan, "square": np.square,
    "erf": np.vectorize(math.erf),
    "relu": lambda x: np.maximum(x, 0), "relu6": lambda x: np.clip(x, 0, 6),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "silu": lambda x: x / (1 + np.exp(-x)),
    "softsign": lambda x: x / (1 + np.abs(x)), "softplus": lambda x: np.log1p(np.exp(x)),
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_ops(rng, tmp_path, op):
    @program(((3, 7), F32))
    def prog(x):
        return getattr(mb, op)(x=x)

    x = (rng.standard_normal((3, 7)) * 3).astype(F32)
    if op == "round":  # (halves round to even in numpy and MIL alike; keep clear of them)
        x = np.round(x) + rng.uniform(-0.4, 0.4, x.shape).astype(F32)
    (got,) = run(save(prog, tmp_path / "m.mlpackage"), {"x": x})
    np.testing.assert_allclose(got, UNARY[op](x.astype(np.float64)), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("op,lo", [("sqrt", 0), ("rsqrt", 0.1), ("log", 0.1), ("inverse", 0.5),
                                   ("asin", -0.9), ("acos", -0.9), ("atanh", -0.9)])
def test_unary_ops_on_their_domain(rng, tmp_path, op, lo):
    @program(((4, 5), F32))
    def prog(x):
        return getattr(mb, op)(x=x)

    hi = 0.9 if lo < 0 else 4.0
    x = rng.uniform(lo, hi, (4, 5)).astype(F32)
    xd = x.astype(np.float64)
    want = {"sqrt": np.sqrt, "rsqrt": lambda v: 1 / np.sqrt(v + 1e-12),
            "log": lambda v: np.log(v + 1e-45), "inverse": lambda v: 1 / (v + 1e-4),
            "asin": np.arcsin, "acos": np.arccos, "atanh": np.arctanh}[op](xd)
    (got,) = run(save(prog, tmp_path / "m.mlpackage"), {"x": x})
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("mode", ["EXACT", "TANH_APPROXIMATION", "SIGMOID_APPROXIMATION"])
def test_gelu_modes(rng, tmp_path, mode):
    @program(((4, 6), F32))
    def prog(x):
        return mb.gelu(x=x, mode=mode)

    x = (rng.standard_normal((4, 6)) * 2).astype(F32)
    (got,) = run(save(prog, tmp_path / "m.mlpackage"), {"x": x})
    np.testing.assert_allclose(got, _gelu(x.astype(np.float64), mode), rtol=1e-5, atol=1e-5)


def test_activations_with_parameters(rng, tmp_path):
    alpha = rng.uniform(0.1, 0.5, 3).astype(F32)

    @program(((2, 3, 2, 5), F32))
    def prog(x):
        return (mb.leaky_relu(x=x, alpha=0.2), mb.elu(x=x, alpha=0.7),
                mb.clamped_relu(x=x, alpha=0.1, beta=1.5), mb.linear_activation(x=x, alpha=2.0,
                                                                                beta=-1.0),
                mb.scaled_tanh(x=x, alpha=1.5, beta=0.5), mb.sigmoid_hard(x=x, alpha=0.3,
                                                                          beta=0.4),
                mb.thresholded_relu(x=x, alpha=0.6), mb.clip(x=x, alpha=-0.5, beta=0.8),
                mb.threshold(x=x, alpha=0.25), mb.prelu(x=x, alpha=alpha))

    x = (rng.standard_normal((2, 3, 2, 5)) * 2).astype(F32)
    xd = x.astype(np.float64)
    a = alpha.astype(np.float64).reshape(1, 3, 1, 1)
    want = [np.where(xd > 0, xd, 0.2 * xd), np.where(xd > 0, xd, 0.7 * (np.exp(xd) - 1)),
            np.minimum(np.maximum(xd, 0), 1.5) + 0.1 * np.minimum(xd, 0), 2 * xd - 1,
            1.5 * np.tanh(0.5 * xd), np.clip(0.3 * xd + 0.4, 0, 1), np.where(xd > 0.6, xd, 0),
            np.clip(xd, -0.5, 0.8), np.maximum(xd, 0.25), np.where(xd >= 0, xd, a * xd)]
    got = run(save(prog, tmp_path / "m.mlpackage"), {"x": x})
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax(rng, tmp_path, axis):
    @program(((3, 4, 5), F32))
    def prog(x):
        return mb.softmax(x=x, axis=axis)

    x = (rng.standard_normal((3, 4, 5)) * 3).astype(F32)
    xd = x.astype(np.float64)
    e = np.exp(xd - xd.max(axis=axis, keepdims=True))
    (got,) = run(save(prog, tmp_path / "m.mlpackage"), {"x": x})
    np.testing.assert_allclose(got, e / e.sum(axis=axis, keepdims=True), rtol=1e-5, atol=1e-7)


REDUCE = {
    "reduce_sum": np.sum, "reduce_mean": np.mean, "reduce_max": np.max, "reduce_min": np.min,
    "reduce_prod": np.prod, "reduce_l1_norm": lambda x, **k: np.sum(np.abs(x), **k),
    "reduce_l2_norm": lambda x, **k: np.sqrt(np.sum(x * x, **k)),
    "reduce_sum_square": lambda x, **k: np.sum(x * x, **k),
    "reduce_log_sum": lambda x, **k: np.log(np.sum(x, **k)),
    "reduce_log_sum_exp": lambda x, **k: np.log(np.sum(np.exp(x), **k)),
}


@pytest.mark.parametrize("op", sorted(REDUCE))
@pytest.mark.parametrize("axes,keep", [([1], False), ([0, -1], True), (None, False)])
def test_reductions(rng, tmp_path, op, axes, keep):
    @program(((3, 4, 5), F32))
    def prog(x):
        return getattr(mb, op)(x=x, axes=axes, keep_dims=keep)

    x = rng.uniform(0.5, 1.5, (3, 4, 5)).astype(F32)
    ax = None if axes is None else tuple(axes)
    want = REDUCE[op](x.astype(np.float64), axis=ax, keepdims=keep)
    (got,) = run(save(prog, tmp_path / "m.mlpackage"), {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["reduce_argmax", "reduce_argmin"])
@pytest.mark.parametrize("axis,keep", [(1, False), (-1, True)])
def test_arg_reductions(rng, tmp_path, op, axis, keep):
    @program(((3, 4, 5), F32))
    def prog(x):
        return getattr(mb, op)(x=x, axis=axis, keep_dims=keep)

    x = rng.standard_normal((3, 4, 5)).astype(F32)
    f = np.argmax if op == "reduce_argmax" else np.argmin
    want = f(x, axis=axis)
    if keep:
        want = np.expand_dims(want, axis)
    (got,) = run(save(prog, tmp_path / "m.mlpackage"), {"x": x})
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


def test_cast_logical_and_fp16_program(rng, tmp_path):
    @program(((4, 3), np.float16), ((4, 3), np.float16))
    def prog(x, y):
        s = mb.add(x=mb.mul(x=x, y=y), y=x)
        big = mb.greater(x=s, y=np.float16(0.0))
        both = mb.logical_and(x=big, y=mb.logical_not(x=mb.less(x=y, y=np.float16(-1.0))))
        return s, mb.cast(x=s, dtype="fp32"), mb.cast(x=both, dtype="int32")

    x = rng.standard_normal((4, 3)).astype(np.float16)
    y = rng.standard_normal((4, 3)).astype(np.float16)
    path = save(prog, tmp_path / "m.mlpackage", fp16=True)
    m = kiln.coreml.load(path)
    assert [i.dtype for i in m.inputs] == [kiln.f16, kiln.f16]
    assert [o.dtype for o in m.outputs] == [kiln.f16, kiln.f32, kiln.i32]
    s, s32, both = run(path, {"x": x, "y": y})
    # fp16 rounds after each op: the product, then the sum
    want = (x * y).astype(np.float16) + x
    np.testing.assert_array_equal(s, want)
    np.testing.assert_array_equal(s32, want.astype(np.float32))
    np.testing.assert_array_equal(both, ((want > 0) & ~(y < -1)).astype(np.int32))


def _linear_weight_program(w, target):
    @program(((3, w.shape[1]), F32), target=target)
    def prog(x):
        return mb.matmul(x=x, y=np.ascontiguousarray(w.T))

    return prog


def test_quantized_weights_expand_as_coremltools_defines(rng, tmp_path):
    w = rng.standard_normal((40, 24)).astype(F32)
    prog = _linear_weight_program(w, IOS16)
    import coremltools.optimize.coreml as cto

    base = ct.models.MLModel(save(prog, tmp_path / "base.mlpackage"))
    cfg = cto.OptimizationConfig(global_config=cto.OpLinearQuantizerConfig(
        mode="linear_symmetric", weight_threshold=10))
    q = cto.linear_quantize_weights(base, cfg)
    q.save(str(tmp_path / "q.mlpackage"))
    m = kiln.coreml.load(str(tmp_path / "q.mlpackage"))
    assert m.op_histogram.get("constexpr_affine_dequantize") == 1
    # kiln's expanded weight, read back through the product with the identity: 8-bit symmetric
    # quantization moves each weight by at most half a step (a step at most max|w| / 127)
    (got,) = run(tmp_path / "q.mlpackage", {"x": np.eye(3, 24, dtype=F32)})
    step = np.abs(w).max() / 127
    assert np.abs(got - w[:, :3].T).max() <= step / 2 + 1e-6
    assert not np.array_equal(got, w[:, :3].T)  # (quantized: not the float weights)
    x = rng.standard_normal((3, 24)).astype(F32)
    (out,) = run(tmp_path / "q.mlpackage", {"x": x})
    bound = np.abs(x).astype(np.float64).sum(axis=1, keepdims=True) * step / 2
    assert np.all(np.abs(out - x.astype(np.float64) @ w.T) <= bound + 1e-4)


def test_palettized_weights_are_the_table_entries(rng, tmp_path):
    import coremltools.optimize.coreml as cto

    w = rng.standard_normal((32, 16)).astype(F32)
    prog = _linear_weight_program(w, IOS16)
    base = ct.models.MLModel(save(prog, tmp_path / "base.mlpackage"))
    cfg = cto.OptimizationConfig(global_config=cto.OpPalettizerConfig(
        mode="kmeans", nbits=4, weight_threshold=10))
    p = cto.palettize_weights(base, cfg)
    p.save(str(tmp_path / "p.mlpackage"))
    m = kiln.coreml.load(str(tmp_path / "p.mlpackage"))
    assert m.op_histogram.get("constexpr_lut_to_dense") == 1
    # kiln's expanded weight: recover it from the product with the identity
    (got,) = run(tmp_path / "p.mlpackage", {"x": np.eye(3, 16, dtype=F32)})
    wq = got.T[:, :3]
    # every weight is one of at most 16 values (the table), and k-means gives each weight the
    # table's nearest entry (a weight far from the rest may still be far from its entry: no
    # fixed bound holds for every draw)
    table = np.unique(got)
    assert len(table) <= 16
    nearest = np.abs(w[:, :3, None] - table[None, None, :]).min(axis=2)
    assert np.all(np.abs(wq - w[:, :3]) <= nearest + 1e-3 * np.abs(w).max())


@pytest.mark.parametrize("qtype", [np.uint8, np.int8])
@pytest.mark.parametrize("per_row", [True, False])
def test_affine_dequantized_weights(rng, tmp_path, qtype, per_row):
    # iOS16's constexpr_affine_dequantize: w = (q - zero_point) * scale, per row (axis 0) or one
    # zero point and scale for the whole weight
    lo, hi = (0, 256) if qtype == np.uint8 else (-128, 128)
    q = rng.integers(lo, hi, (8, 6)).astype(qtype)
    zp = rng.integers(lo, hi, (8,) if per_row else ()).astype(qtype)
    scale = rng.uniform(0.01, 0.1, (8,) if per_row else ()).astype(F32)

    @program(((2, 6), F32))
    def prog(x):
        w = mb.constexpr_affine_dequantize(quantized_data=q, zero_point=zp, scale=scale, axis=0)
        return mb.matmul(x=x, y=w, transpose_y=True)

    x = rng.standard_normal((2, 6)).astype(F32)
    col = (lambda a: a[:, None]) if per_row else (lambda a: a)
    w = (q.astype(np.float64) - col(zp.astype(np.float64))) * col(scale.astype(np.float64))
    (got,) = run(save(prog, tmp_path / "m.mlpackage"), {"x": x})
    np.testing.assert_allclose(got, x.astype(np.float64) @ w.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", [IOS16, IOS18])
def test_sparse_weights(rng, tmp_path, target):
    w = rng.standard_normal((8, 6)).astype(F32)
    w[rng.random(w.shape) < 0.5] = 0
    mask = w != 0

    @program(((2, 6), F32), target=target)
    def prog(x):
        if target == IOS16:  # the mask's bits packed into bytes, the shape given
            ws = mb.constexpr_sparse_to_dense(
                nonzero_data=w[mask], shape=np.array([8, 6], np.uint32),
                mask=np.packbits(mask.reshape(-1).astype(np.uint8), bitorder="little"))
        else:  # a uint1 mask of the weight's shape
            from coremltools.converters.mil.mil import types

            ws = mb.constexpr_sparse_to_dense(
                nonzero_data=w[mask], mask=mb.const(val=mask.astype(types.np_uint1_dtype)))
        return mb.matmul(x=x, y=ws, transpose_y=True)

    x = rng.standard_normal((2, 6)).astype(F32)
    (got,) = run(save(prog, tmp_path / "m.mlpackage", target=target), {"x": x})
    np.testing.assert_allclose(got, x.astype(np.float64) @ w.T, rtol=1e-5, atol=1e-5)


def test_blockwise_and_grouped_palettized_weights(rng, tmp_path):
    data = rng.integers(-8, 8, (8, 6)).astype(np.int8)
    scale = rng.uniform(0.1, 1, (4, 3)).astype(F32)
    offset = rng.integers(-2, 2, (4, 3)).astype(np.int8)
    # iOS18 palettization: a table of 4 entries per block of 4 rows
    idx = rng.integers(0, 4, (8, 6)).astype(np.uint8)
    lut = rng.standard_normal((2, 1, 4, 1)).astype(F32)

    @program(((2, 6), F32), target=IOS18)
    def prog(x):
        from coremltools.converters.mil.mil import types

        wb = mb.constexpr_blockwise_shift_scale(data=data, scale=scale, offset=offset)
        wl = mb.constexpr_lut_to_dense(indices=mb.const(val=idx.astype(types.np_uint2_dtype)),
                                       lut=lut)
        return mb.matmul(x=x, y=wb, transpose_y=True), mb.matmul(x=x, y=wl, transpose_y=True)

    x = rng.standard_normal((2, 6)).astype(F32)
    got_block, got_lut = run(save(prog, tmp_path / "m.mlpackage", target=IOS18), {"x": x})
    wb = np.repeat(np.repeat(scale, 2, 0), 2, 1) * (
        data.astype(np.float64) - np.repeat(np.repeat(offset, 2, 0), 2, 1))
    np.testing.assert_allclose(got_block, x.astype(np.float64) @ wb.T, rtol=1e-5, atol=1e-5)
    wl = np.where(np.arange(8)[:, None] < 4, lut[0, 0, :, 0][idx], lut[1, 0, :, 0][idx])
    np.testing.assert_allclose(got_lut, x.astype(np.float64) @ wl.T, rtol=1e-5, atol=1e-5)


def test_model_inputs_outputs_and_metadata(rng, tmp_path):
    @program(((2, 3), F32), ((3,), F32))
    def prog(a, b):
        return mb.add(x=a, y=b, name="total"), mb.relu(x=a, name="positive")

    mm = ct.models.MLModel(save(prog, tmp_path / "m.mlpackage"))
    mm.author, mm.short_description = "kiln tests", "adds and clips"
    mm.user_defined_metadata["origin"] = "builder"
    path = str(tmp_path / "meta.mlpackage")
    mm.save(path)
    m = kiln.coreml.load(path)
    assert m.kind == "mlProgram" and m.function == "main" and m.opset.startswith("CoreML")
    want_inputs = [("a", [2, 3], kiln.f32), ("b", [3], kiln.f32)]
    assert [(i.name, i.shape, i.dtype) for i in m.inputs] == want_inputs
    assert [o.name for o in m.outputs] == ["total", "positive"]
    assert m.metadata["author"] == "kiln tests" and m.metadata["origin"] == "builder"
    assert m.op_histogram == {"add": 1, "relu": 1} and "ValueInfo('a'" in repr(m.inputs[0])
    assert "relu" in kiln.coreml.supported_ops() and kiln.coreml.available()
    a = rng.standard_normal((2, 3)).astype(F32)
    b = rng.standard_normal(3).astype(F32)
    total, pos = run(path, {"a": a, "b": b})
    np.testing.assert_allclose(total, a + b, rtol=1e-6)
    np.testing.assert_array_equal(pos, np.maximum(a, 0))
    # the specification file alone, its weights read from a named directory
    spec = next((tmp_path / "meta.mlpackage" / "Data").rglob("model.mlmodel"))
    m2 = kiln.coreml.load_bytes(spec.read_bytes())
    np.testing.assert_allclose(m2.compile(device="cpu").run({"a": a, "b": b})[0].numpy(), a + b)
    with pytest.raises(kiln.ValueError, match="'b'"):
        m.compile(device="cpu").run({"a": a})


def test_every_unsupported_op_is_named_together(tmp_path):
    @program(((4, 4), F32))
    def prog(x):
        y = mb.random_uniform(shape=np.array([4, 4], np.int32))
        z = mb.non_zero(x=x)
        return mb.add(x=x, y=y), z

    with pytest.raises(kiln.UnsupportedError) as e:
        kiln.coreml.load(save(prog, tmp_path / "m.mlpackage"))
    assert "random_uniform" in str(e.value) and "non_zero" in str(e.value)
    assert "add" not in str(e.value).split(":", 1)[1]


def test_bad_files_fail_clearly(rng, tmp_path):
    with pytest.raises(kiln.FormatError, match="not a Core ML"):
        kiln.coreml.load_bytes(b"\x08\x07\x12\xff\xff")
    with pytest.raises(kiln.IoError):
        kiln.coreml.load(str(tmp_path / "missing.mlpackage"))
    w = rng.standard_normal((20, 6)).astype(F32)
    path = save(_linear_weight_program(w, IOS16), tmp_path / "m.mlpackage")
    weights = next((tmp_path / "m.mlpackage").rglob("weight.bin"))
    # a damaged blob: its sentinel overwritten
    good = weights.read_bytes()
    weights.write_bytes(good[:64] + b"\0" * 4 + good[68:])
    with pytest.raises(kiln.FormatError, match="no blob"):
        kiln.coreml.load(path)
    weights.write_bytes(good[:100])
    with pytest.raises(kiln.FormatError):
        kiln.coreml.load(path)
    weights.write_bytes(good)
    # a manifest that points outside the package
    manifest = tmp_path / "m.mlpackage" / "Manifest.json"
    j = json.loads(manifest.read_text())
    root = j["rootModelIdentifier"]
    j["itemInfoEntries"][root]["path"] = "../../elsewhere.mlmodel"
    manifest.write_text(json.dumps(j))
    with pytest.raises(kiln.IoError, match="outside"):
        kiln.coreml.load(path)
    # the specification alone without a weights directory
    shutil.rmtree(tmp_path / "m.mlpackage")
    with pytest.raises(kiln.IoError):
        kiln.coreml.load(path)


def test_input_shapes_fix_flexible_dims(rng, tmp_path):
    @program(((2, 3), F32))
    def prog(x):
        return mb.mul(x=x, y=2.0)

    path = save(prog, tmp_path / "m.mlpackage")
    with pytest.raises(kiln.ShapeError, match="ImportOptions"):
        kiln.coreml.load(path, input_shapes={"x": [3, 3]})
    with pytest.raises(kiln.ValueError, match="no input"):
        kiln.coreml.load(path, input_shapes={"y": [2, 3]})
    with pytest.raises(kiln.ValueError, match="no function"):
        kiln.coreml.load(path, function="other")
    x = rng.standard_normal((2, 3)).astype(F32)
    (got,) = run(path, {"x": x}, input_shapes={"x": [2, 3]})
    np.testing.assert_allclose(got, 2 * x, rtol=1e-6)


def test_docs_list_every_supported_op():
    import importlib.util
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    script = root / "scripts" / "coreml_docs.py"
    spec = importlib.util.spec_from_file_location("coreml_docs", script)
    docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(docs)
    text = (root / "docs" / "coreml.md").read_text()
    assert docs.render(text, sorted(kiln.coreml.supported_ops())) == text, (
        "docs/coreml.md's op table is out of date: run scripts/coreml_docs.py")


def test_flexible_dims_stay_dynamic(rng, tmp_path):
    from coremltools.converters.mil.mil import get_new_symbol

    @mb.program(input_specs=[mb.TensorSpec(shape=(get_new_symbol(), 3))], opset_version=IOS16)
    def prog(x):
        return mb.reduce_sum(x=mb.mul(x=x, y=x), axes=[1], keep_dims=False)

    path = save(prog, tmp_path / "m.mlpackage")  # (the symbol declared as 1 to 64)
    m = kiln.coreml.load(path)
    assert m.inputs[0].shape == [-1, 3]
    exe = m.compile(device="cpu")
    for n in (1, 5):
        x = rng.standard_normal((n, 3)).astype(F32)
        np.testing.assert_allclose(exe.run({"x": x})[0].numpy(), (x.astype(np.float64)**2).sum(1),
                                   rtol=1e-5)
    fixed = kiln.coreml.load(path, input_shapes={"x": [4, 3]})
    assert fixed.inputs[0].shape == [4, 3]


def test_multifunction_models_pick_a_function(rng, tmp_path):
    @program(((2, 3), F32))
    def double(x):
        return mb.mul(x=x, y=2.0)

    @program(((2, 3), F32))
    def negate(x):
        return mb.mul(x=x, y=-1.0)

    a, b = save(double, tmp_path / "a.mlpackage"), save(negate, tmp_path / "b.mlpackage")
    desc = ct.utils.MultiFunctionDescriptor()
    desc.add_function(a, src_function_name="main", target_function_name="double")
    desc.add_function(b, src_function_name="main", target_function_name="negate")
    desc.default_function_name = "double"
    path = str(tmp_path / "multi.mlpackage")
    ct.utils.save_multifunction(desc, path)
    x = rng.standard_normal((2, 3)).astype(F32)
    m = kiln.coreml.load(path)
    assert m.function == "double"
    np.testing.assert_allclose(run(path, {"x": x})[0], 2 * x)
    np.testing.assert_allclose(run(path, {"x": x}, function="negate")[0], -x)


def test_flexible_dim_ranges_bound_the_feeds(rng, tmp_path):
    from coremltools.converters.mil.mil import get_new_symbol

    @mb.program(input_specs=[mb.TensorSpec(shape=(get_new_symbol(), 3))], opset_version=IOS16)
    def prog(x):
        return mb.mul(x=x, y=3.0)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mm = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=IOS16,
                        inputs=[ct.TensorType(name="x", shape=(ct.RangeDim(2, 6), 3))],
                        pass_pipeline=ct.PassPipeline.EMPTY)
    path = str(tmp_path / "m.mlpackage")
    mm.save(path)
    m = kiln.coreml.load(path)
    assert m.inputs[0].shape == [-1, 3]
    exe = m.compile(device="cpu")
    for n in (2, 6):
        x = rng.standard_normal((n, 3)).astype(F32)
        np.testing.assert_allclose(exe.run({"x": x})[0].numpy(), 3 * x, rtol=1e-6)
    for n in (1, 7):  # outside the model's range [2, 6]
        with pytest.raises(kiln.ShapeError, match="must be in"):
            exe.run({"x": rng.standard_normal((n, 3)).astype(F32)})
    with pytest.raises(kiln.ShapeError, match="ranges"):
        kiln.coreml.load(path, input_shapes={"x": [8, 3]})


@pytest.mark.parametrize("layout", ["RGB", "BGR", "G"])
def test_image_inputs_scale_and_bias(rng, tmp_path, layout):
    c = 1 if layout == "G" else 3

    @program(((1, c, 4, 5), F32))
    def prog(x):
        return mb.reduce_mean(x=x, axes=[2, 3], keep_dims=False)

    bias = [-0.5, -0.25, 0.125][:c] if c == 3 else -0.5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mm = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=IOS16,
                        compute_precision=ct.precision.FLOAT32,
                        inputs=[ct.ImageType(name="x", shape=(1, c, 4, 5), scale=1 / 255.0,
                                             bias=bias,
                                             color_layout=getattr(ct.colorlayout, {
                                                 "G": "GRAYSCALE"}.get(layout, layout)))])
    path = str(tmp_path / "m.mlpackage")
    mm.save(path)
    m = kiln.coreml.load(path)
    assert m.inputs[0].image == {"G": "GRAYSCALE"}.get(layout, layout)
    assert m.inputs[0].shape == [1, c, 4, 5] and m.inputs[0].dtype == kiln.f32
    x = rng.integers(0, 256, (1, c, 4, 5)).astype(F32)  # pixel values, in the model's order
    (got,) = run(path, {"x": x})
    want = x.astype(np.float64).mean(axis=(2, 3)) / 255 + np.array(bias, ndmin=1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_logical_identity_softplus_parametric_and_constexpr_cast(rng, tmp_path):
    alpha = rng.uniform(0.5, 2, 3).astype(F32)
    beta = rng.uniform(0.5, 2, 3).astype(F32)
    w16 = rng.standard_normal((4, 5)).astype(np.float16)

    @program(((2, 3, 4, 5), F32))
    def prog(x):
        pos, big = mb.greater(x=x, y=0.0), mb.greater(x=x, y=0.5)
        w = mb.constexpr_cast(source_val=w16, output_dtype="fp32")
        return (mb.cast(x=mb.logical_or(x=pos, y=big), dtype="int32"),
                mb.cast(x=mb.logical_xor(x=pos, y=big), dtype="int32"), mb.identity(x=x),
                mb.softplus_parametric(x=x, alpha=alpha, beta=beta), mb.mul(x=x, y=w))

    x = rng.standard_normal((2, 3, 4, 5)).astype(F32)
    got = run(save(prog, tmp_path / "m.mlpackage"), {"x": x})
    xd = x.astype(np.float64)
    a, b = alpha.reshape(1, 3, 1, 1), beta.reshape(1, 3, 1, 1)
    np.testing.assert_array_equal(got[0], ((x > 0) | (x > 0.5)).astype(np.int32))
    np.testing.assert_array_equal(got[1], ((x > 0) ^ (x > 0.5)).astype(np.int32))
    np.testing.assert_array_equal(got[2], x)
    np.testing.assert_allclose(got[3], a * np.log1p(np.exp(b * xd)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[4], xd * w16.astype(np.float64), rtol=1e-6)
