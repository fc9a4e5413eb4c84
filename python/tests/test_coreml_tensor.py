"""Core ML import of MIL's tensor ops (src/io/coreml/ops_tensor.cpp): reshape and layout ops,
slice_by_index / slice_by_size / slice_update, gather and scatter with their modes, pad, tile,
select, fill, range_1d, shape, band_part, cumsum, topk, argsort, one_hot, the depth/space
rearrangements and sliding_windows. Each test builds a tiny ML Program with coremltools'
builder (no graph passes, so the op stays as written), runs it with kiln on fresh random data and
compares with numpy; one test checks that an unsupported mode fails naming the parameter."""
import numpy as np
import pytest

import kiln
from coreml_util import IOS16, IOS17, IOS18, mb, program, run, save

F32, I32 = np.float32, np.int32


def go(tmp_path, prog, target=IOS16, **feeds):
    """Saves the program and runs it with kiln on `feeds`: the outputs in order."""
    return run(save(prog, tmp_path / "m.mlpackage", target=target), feeds)


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(F32)


# ---- shapes and layout ----

@pytest.mark.parametrize("shape,want", [([4, -1], (4, 6)), ([0, -1, 2], (2, 6, 2)), ([-1], (24,)),
                                        ([-1, 0, 1], (8, 3, 1))])
def test_reshape_known_shape(tmp_path, rng, shape, want):
    x = rand(rng, 2, 3, 4)

    @program(((2, 3, 4), F32))
    def prog(x):
        return mb.reshape(x=x, shape=shape)

    (y,) = go(tmp_path, prog, x=x)
    np.testing.assert_array_equal(y, x.reshape(want))


def test_reshape_zero_right_aligned_ios17(tmp_path, rng):
    # iOS17: a 0 takes x's dim counted from the right, 1 where x has none
    x = rand(rng, 2, 6)

    @program(((2, 6), F32), target=IOS17)
    def prog(x):
        return mb.reshape(x=x, shape=[1, 0, -1, 0])

    (y,) = go(tmp_path, prog, target=IOS17, x=x)
    np.testing.assert_array_equal(y, x.reshape(1, 1, 2, 6))


def test_reshape_computed_shape_and_shape_op(tmp_path, rng):
    # the shape comes from shape() through arithmetic: reshape_to; shape() itself is int32
    x, r = rand(rng, 2, 3, 4), rand(rng, 6, 4)

    @program(((2, 3, 4), F32), ((6, 4), F32))
    def prog(x, r):
        s = mb.shape(x=r)
        return mb.reshape(x=x, shape=mb.mul(x=s, y=np.int32(1))), s, mb.shape(x=x)

    y, s, sx = go(tmp_path, prog, x=x, r=r)
    np.testing.assert_array_equal(y, x.reshape(6, 4))
    assert s.dtype == np.int32 and sx.dtype == np.int32
    np.testing.assert_array_equal(s, [6, 4])
    np.testing.assert_array_equal(sx, [2, 3, 4])


def test_reshape_like(tmp_path, rng):
    x, a, b = rand(rng, 24), rand(rng, 2, 3, 7), rand(rng, 5, 1, 4)

    @program(((24,), F32), ((2, 3, 7), F32), ((5, 1, 4), F32))
    def prog(x, a, b):
        return mb.reshape_like(x=x, ref_tensors=(a, b), begins=(0, 1), ends=(2, 0),
                               end_masks=(False, True))

    (y,) = go(tmp_path, prog, x=x, a=a, b=b)
    np.testing.assert_array_equal(y, x.reshape(2, 3, 1, 4))


@pytest.mark.parametrize("perm", [[2, 0, 1], [-1, -3, -2], [0, 1, 2]])
def test_transpose(tmp_path, rng, perm):
    x = rand(rng, 2, 3, 4)

    @program(((2, 3, 4), F32))
    def prog(x):
        return mb.transpose(x=x, perm=perm)

    (y,) = go(tmp_path, prog, x=x)
    np.testing.assert_array_equal(y, np.transpose(x, [p % 3 for p in perm]))


@pytest.mark.parametrize("axes,want", [(None, (3,)), ([0], (3, 1)), ([-1, 0], (3,)),
                                       ([0, 1], (3, 1))])
def test_squeeze(tmp_path, rng, axes, want):
    # a named dim that is not 1 stays (PyTorch's rule)
    x = rand(rng, 1, 3, 1)

    @program(((1, 3, 1), F32))
    def prog(x):
        return mb.squeeze(x=x) if axes is None else mb.squeeze(x=x, axes=axes)

    (y,) = go(tmp_path, prog, x=x)
    np.testing.assert_array_equal(y, x.reshape(want))


@pytest.mark.parametrize("axes", [[0], [-1], [0, -1], [3, 1], [-4, 2]])
def test_expand_dims(tmp_path, rng, axes):
    x = rng.integers(-9, 9, (2, 3)).astype(I32)

    @program(((2, 3), I32))
    def prog(x):
        return mb.expand_dims(x=x, axes=axes)

    (y,) = go(tmp_path, prog, x=x)
    np.testing.assert_array_equal(y, np.expand_dims(x, tuple(axes)))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_flatten2d(tmp_path, rng, axis):
    x = rand(rng, 2, 3, 4)

    @program(((2, 3, 4), F32))
    def prog(x):
        return mb.flatten2d(x=x, axis=axis)

    (y,) = go(tmp_path, prog, x=x)
    a = axis % 3 if axis < 0 else axis
    np.testing.assert_array_equal(y, x.reshape(int(np.prod(x.shape[:a])), -1))


@pytest.mark.parametrize("axis,interleave", [(0, False), (-1, False), (1, True), (-3, True)])
def test_concat(tmp_path, rng, axis, interleave):
    a, b = rand(rng, 2, 3, 4), rand(rng, 2, 3, 4)

    @program(((2, 3, 4), F32), ((2, 3, 4), F32))
    def prog(a, b):
        return mb.concat(values=(a, b, a), axis=axis, interleave=interleave)

    (y,) = go(tmp_path, prog, a=a, b=b)
    if interleave:
        want = np.stack([a, b, a], axis=axis % 3 + 1).reshape(
            [d * (3 if i == axis % 3 else 1) for i, d in enumerate(a.shape)])
    else:
        want = np.concatenate([a, b, a], axis=axis)
    np.testing.assert_array_equal(y, want)


def test_concat_int32_with_const(tmp_path, rng):
    a = rng.integers(-50, 50, (3, 2)).astype(I32)
    c = rng.integers(-50, 50, (1, 2)).astype(I32)

    @program(((3, 2), I32))
    def prog(a):
        return mb.concat(values=(c, a), axis=0)

    (y,) = go(tmp_path, prog, a=a)
    np.testing.assert_array_equal(y, np.concatenate([c, a]))


@pytest.mark.parametrize("kw", [{"num_splits": 3, "axis": 1},
                                {"split_sizes": [1, 4, 1], "axis": -2},
                                {"num_splits": 2, "axis": 0}])
def test_split(tmp_path, rng, kw):
    x = rand(rng, 2, 6, 3)

    @program(((2, 6, 3), F32))
    def prog(x):
        return mb.split(x=x, **kw)

    ys = go(tmp_path, prog, x=x)
    at = kw.get("split_sizes") or [x.shape[kw["axis"]] // kw["num_splits"]] * kw["num_splits"]
    want = np.split(x, np.cumsum(at)[:-1], axis=kw["axis"])
    assert len(ys) == len(want)
    for y, w in zip(ys, want):
        np.testing.assert_array_equal(y, w)


@pytest.mark.parametrize("axis", [0, 2, -1, -3])
def test_stack(tmp_path, rng, axis):
    a, b = rand(rng, 2, 3), rand(rng, 2, 3)

    @program(((2, 3), F32), ((2, 3), F32))
    def prog(a, b):
        return mb.stack(values=(a, b), axis=axis)

    (y,) = go(tmp_path, prog, a=a, b=b)
    np.testing.assert_array_equal(y, np.stack([a, b], axis=axis))


def test_tile_and_reverse(tmp_path, rng):
    x = rand(rng, 2, 3)

    @program(((2, 3), F32))
    def prog(x):
        return (mb.tile(x=x, reps=[2, 3]), mb.reverse(x=x, axes=[-1]), mb.reverse(x=x),
                mb.reverse(x=x, axes=[0, 1]))

    t, r1, r_all, r01 = go(tmp_path, prog, x=x)
    np.testing.assert_array_equal(t, np.tile(x, (2, 3)))
    np.testing.assert_array_equal(r1, x[:, ::-1])
    np.testing.assert_array_equal(r_all, x[::-1, ::-1])
    np.testing.assert_array_equal(r01, x[::-1, ::-1])


def _d2s(x, b):  # TensorFlow's depth_to_space (DCR) in NCHW
    n, c, h, w = x.shape
    y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    return y.reshape(n, c // (b * b), h * b, w * b)


def _s2d(x, b):
    n, c, h, w = x.shape
    y = x.reshape(n, c, h // b, b, w // b, b).transpose(0, 3, 5, 1, 2, 4)
    return y.reshape(n, c * b * b, h // b, w // b)


def _shuffle(x, r):  # PyTorch's pixel_shuffle (CRD)
    n, c, h, w = x.shape
    y = x.reshape(n, c // (r * r), r, r, h, w).transpose(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (r * r), h * r, w * r)


def _unshuffle(x, r):
    n, c, h, w = x.shape
    y = x.reshape(n, c, h // r, r, w // r, r).transpose(0, 1, 3, 5, 2, 4)
    return y.reshape(n, c * r * r, h // r, w // r)


def test_depth_space_and_pixel_shuffle(tmp_path, rng):
    x, s = rand(rng, 2, 8, 3, 5), rand(rng, 1, 3, 4, 6)

    @program(((2, 8, 3, 5), F32), ((1, 3, 4, 6), F32))
    def prog(x, s):
        return (mb.depth_to_space(x=x, block_size=2), mb.pixel_shuffle(x=x, upscale_factor=2),
                mb.space_to_depth(x=s, block_size=2),
                mb.pixel_unshuffle(x=s, downscale_factor=np.uint32(2)))

    d2s, shuf, s2d, unshuf = go(tmp_path, prog, x=x, s=s)
    np.testing.assert_array_equal(d2s, _d2s(x, 2))
    np.testing.assert_array_equal(shuf, _shuffle(x, 2))
    np.testing.assert_array_equal(s2d, _s2d(s, 2))
    np.testing.assert_array_equal(unshuf, _unshuffle(s, 2))
    np.testing.assert_array_equal(_s2d(d2s, 2), x)  # the references invert each other


# ---- slicing and padding ----

SLICES = [  # begin, end, stride, begin_mask, end_mask, squeeze_mask
    ([0, 1, 1], [2, 3, 5], None, None, None, None),
    ([-2, -3, 0], [-1, 4, 6], [1, 2, 3], None, None, None),
    ([1, 0, 4], [0, 0, 0], [-1, 1, -2], [False, True, False], [True, True, True], None),
    ([0, 2, -1], [0, 0, 0], [1, 1, 1], [True, False, False], [True, True, False],
     [False, True, True]),
    ([-1, 3, 0], [-3, 0, 1], [-1, -1, 1], None, None, [False, False, True]),
    ([0, 0, -1], [1, 1, 0], None, None, None, [True, True, True]),
]


def _np_slice(x, begin, end, stride, bm, em, sm):
    idx = []
    for d in range(x.ndim):
        if sm and sm[d]:
            idx.append(begin[d])
            continue
        b = None if bm and bm[d] else begin[d]
        e = None if em and em[d] else end[d]
        idx.append(slice(b, e, stride[d] if stride else 1))
    return x[tuple(idx)]


def _opt(**kw):
    return {k: np.array(v) for k, v in kw.items() if v is not None}


@pytest.mark.parametrize("begin,end,stride,bm,em,sm", SLICES)
def test_slice_by_index(tmp_path, rng, begin, end, stride, bm, em, sm):
    x = rand(rng, 3, 4, 6)
    kw = _opt(stride=stride, begin_mask=bm, end_mask=em, squeeze_mask=sm)

    @program(((3, 4, 6), F32))
    def prog(x):
        return mb.slice_by_index(x=x, begin=begin, end=end, **kw)

    (y,) = go(tmp_path, prog, x=x)
    want = _np_slice(x, begin, end, stride, bm, em, sm)
    np.testing.assert_array_equal(y, want)
    assert y.shape == want.shape


@pytest.mark.parametrize("stride,bm,em", [(None, None, None), ([1, 2], None, [False, True]),
                                          ([-1, 1], [True, False], None)])
def test_slice_by_index_computed_bounds(tmp_path, rng, stride, bm, em):
    # begin and end computed by the program (from shape()): kiln's slice on values
    x = rand(rng, 5, 7)
    kw = _opt(stride=stride, begin_mask=bm, end_mask=em)

    @program(((5, 7), F32))
    def prog(x):
        s = mb.shape(x=x)
        begin = mb.sub(x=s, y=np.array([4, 6], I32))
        end = mb.sub(x=s, y=np.array([1, 2], I32))
        return mb.slice_by_index(x=x, begin=begin, end=end, **kw)

    (y,) = go(tmp_path, prog, x=x)
    np.testing.assert_array_equal(y, _np_slice(x, [1, 1], [4, 5], stride, bm, em, None))


@pytest.mark.parametrize("begin,size", [([0, 1], [2, 3]), ([-2, 2], [-1, -1]), ([-3, -4], [3, 2])])
def test_slice_by_size(tmp_path, rng, begin, size):
    x = rng.integers(-100, 100, (4, 6)).astype(I32)

    @program(((4, 6), I32))
    def prog(x):
        known = mb.slice_by_size(x=x, begin=begin, size=size)
        computed = mb.slice_by_size(x=x, begin=mb.mul(x=np.array(begin, I32), y=np.int32(1)),
                                    size=mb.mul(x=np.array(size, I32), y=np.int32(1)))
        return known, computed

    idx = tuple(slice(b if b >= 0 else b + n, None if s == -1 else (b if b >= 0 else b + n) + s)
                for b, s, n in zip(begin, size, x.shape))
    for y in go(tmp_path, prog, x=x):
        np.testing.assert_array_equal(y, x[idx])


@pytest.mark.parametrize("begin,end,stride,sm", [
    ([1, 0, 2], [3, 4, 5], None, None),
    ([0, 1, 0], [2, 4, 6], [1, 2, 3], None),
    ([2, 3, 5], [0, 0, 0], [-1, -2, -2], None),
    ([1, 0, 0], [2, 4, 6], None, [True, False, False]),
])
def test_slice_update(tmp_path, rng, begin, end, stride, sm):
    x = rand(rng, 3, 4, 6)
    u = rand(rng, *_np_slice(x, begin, end, stride, None, None, sm).shape)
    kw = _opt(stride=stride, squeeze_mask=sm)

    @program(((3, 4, 6), F32), (u.shape, F32), target=IOS18)
    def prog(x, u):
        return mb.slice_update(x=x, update=u, begin=begin, end=end, **kw)

    (y,) = go(tmp_path, prog, target=IOS18, x=x, u=u)
    want = x.copy()
    idx = tuple(begin[d] if sm and sm[d] else slice(begin[d], end[d], stride[d] if stride else 1)
                for d in range(3))
    want[idx] = u
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("pad,mode,val", [([1, 2], "constant", 0.0),
                                          ([2, 0, 1, 3], "constant", -1.5),
                                          ([1, 2, 0, 3], "reflect", 0.0),
                                          ([2, 1, 3, 0], "replicate", 0.0),
                                          ([0, 0, 1, 1, 2, 2], "constant", 7.0)])
def test_pad(tmp_path, rng, pad, mode, val):
    x = rand(rng, 2, 4, 5)

    @program(((2, 4, 5), F32))
    def prog(x):
        return mb.pad(x=x, pad=np.array(pad, I32), mode=mode, constant_val=np.float32(val))

    (y,) = go(tmp_path, prog, x=x)
    widths = [(0, 0)] * (3 - len(pad) // 2) + [tuple(pad[i:i + 2]) for i in range(0, len(pad), 2)]
    if mode == "constant":
        want = np.pad(x, widths, constant_values=val)
    else:
        want = np.pad(x, widths, mode="edge" if mode == "replicate" else mode)
    np.testing.assert_array_equal(y, want)


def test_sliding_windows(tmp_path, rng):
    x = rand(rng, 2, 9, 3)

    @program(((2, 9, 3), F32), target=IOS17)
    def prog(x):
        return mb.sliding_windows(x=x, axis=1, size=4, stride=2)

    (y,) = go(tmp_path, prog, target=IOS17, x=x)
    want = np.stack([x[:, s:s + 4] for s in range(0, 6, 2)], axis=1)
    np.testing.assert_array_equal(y, want)


# ---- gather and scatter ----

@pytest.mark.parametrize("axis,ishape", [(0, (4,)), (1, (2, 3)), (-1, (5,))])
def test_gather(tmp_path, rng, axis, ishape):
    # negative indices count from the end
    x = rng.integers(-100, 100, (3, 4, 5)).astype(I32)
    n = x.shape[axis]
    idx = rng.integers(-n, n, ishape).astype(I32)
    k = int(rng.integers(-n, n))

    @program(((3, 4, 5), I32), (ishape, I32))
    def prog(x, i):
        return mb.gather(x=x, indices=i, axis=axis), mb.gather(x=x, indices=np.int32(k), axis=axis)

    y, one = go(tmp_path, prog, x=x, i=idx)
    np.testing.assert_array_equal(y, np.take(x, idx, axis=axis))
    np.testing.assert_array_equal(one, np.take(x, k, axis=axis))


@pytest.mark.parametrize("axis,batch_dims", [(1, 1), (2, 1), (2, 2), (-1, 1)])
def test_gather_batch_dims(tmp_path, rng, axis, batch_dims):
    x = rand(rng, 2, 3, 4, 5)
    n = x.shape[axis]
    ishape = x.shape[:batch_dims] + (2, 3)
    idx = rng.integers(0, n, ishape).astype(I32)

    @program((x.shape, F32), (ishape, I32), target=IOS17)
    def prog(x, i):
        return mb.gather(x=x, indices=i, axis=axis, batch_dims=batch_dims, validate_indices=True)

    (y,) = go(tmp_path, prog, target=IOS17, x=x, i=idx)
    a = axis % 4
    b = batch_dims
    want = np.empty(x.shape[:a] + idx.shape[b:] + x.shape[a + 1:], F32)
    for bi in np.ndindex(*x.shape[:b]):
        want[bi] = np.take(x[bi], idx[bi], axis=a - b)
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_along_axis(tmp_path, rng, axis):
    x = rand(rng, 3, 4, 5)
    ishape = list(x.shape)
    ishape[axis] = 6
    idx = rng.integers(0, x.shape[axis], ishape).astype(I32)

    @program(((3, 4, 5), F32), (tuple(ishape), I32))
    def prog(x, i):
        return mb.gather_along_axis(x=x, indices=i, axis=axis)

    (y,) = go(tmp_path, prog, x=x, i=idx)
    np.testing.assert_array_equal(y, np.take_along_axis(x, idx, axis=axis))


@pytest.mark.parametrize("batch_dims,ishape", [(0, (5, 2)), (0, (2, 3, 3)), (1, (3, 4, 1)),
                                               (1, (3, 2))])
def test_gather_nd(tmp_path, rng, batch_dims, ishape):
    x = rand(rng, 3, 4, 5)
    m = ishape[-1]
    idx = np.stack([rng.integers(0, x.shape[batch_dims + k], ishape[:-1]) for k in range(m)],
                   axis=-1).astype(I32)

    @program(((3, 4, 5), F32), (ishape, I32))
    def prog(x, i):
        return mb.gather_nd(x=x, indices=i, batch_dims=batch_dims)

    (y,) = go(tmp_path, prog, x=x, i=idx)
    if batch_dims == 0:
        want = x[tuple(np.moveaxis(idx, -1, 0))]
    else:
        want = np.stack([x[b][tuple(np.moveaxis(idx[b], -1, 0))] for b in range(3)])
    np.testing.assert_array_equal(y, want)


MODES = {"update": None, "add": np.add, "sub": np.subtract, "mul": np.multiply,
         "div": np.divide, "max": np.maximum, "min": np.minimum}


def _scatter_ref(data, positions, updates, mode):
    """positions: for each update element (in index order) the data position it reaches; in float64
    (kiln combines a position's updates in f32, in an order of its own)."""
    out = data.astype(np.float64)
    for p, u in zip(positions, updates):
        out[p] = u if mode == "update" else MODES[mode](out[p], u)
    return out


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("axis", [0, -1])
def test_scatter(tmp_path, rng, mode, axis):
    data = rand(rng, 4, 5)
    n = data.shape[axis]
    # duplicate indices combine (update: unique indices, so the result is defined)
    idx = (rng.permutation(n)[:3] if mode == "update" else rng.integers(0, n, 6)).astype(I32)
    ushape = list(data.shape)
    ushape[axis] = len(idx)
    upd = rng.uniform(0.5, 2.0, ushape).astype(F32)

    @program(((4, 5), F32), (tuple(ushape), F32), (idx.shape, I32))
    def prog(d, u, i):
        return mb.scatter(data=d, indices=i, updates=u, axis=axis, mode=mode)

    (y,) = go(tmp_path, prog, d=data, u=upd, i=idx)
    ax = axis % 2
    pos, vals = [], []
    for k, j in enumerate(idx):
        for o in range(data.shape[1 - ax]):
            pos.append((j, o) if ax == 0 else (o, j))
            vals.append(upd[(k, o) if ax == 0 else (o, k)])
    np.testing.assert_allclose(y, _scatter_ref(data, pos, vals, mode), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["update", "add", "sub", "max"])
def test_scatter_along_axis(tmp_path, rng, mode):
    data = rng.integers(-50, 50, (3, 6)).astype(I32)
    if mode == "update":
        idx = np.stack([rng.permutation(6)[:4] for _ in range(3)]).astype(I32)
    else:
        idx = rng.integers(0, 6, (3, 4)).astype(I32)
    upd = rng.integers(-50, 50, (3, 4)).astype(I32)

    @program(((3, 6), I32), ((3, 4), I32), ((3, 4), I32))
    def prog(d, u, i):
        return mb.scatter_along_axis(data=d, indices=i, updates=u, axis=1, mode=mode)

    (y,) = go(tmp_path, prog, d=data, u=upd, i=idx)
    pos = [(r, idx[r, k]) for r in range(3) for k in range(4)]
    np.testing.assert_array_equal(y, _scatter_ref(data, pos, upd.reshape(-1), mode))


@pytest.mark.parametrize("mode", ["update", "add", "mul", "min"])
def test_scatter_nd(tmp_path, rng, mode):
    data = rand(rng, 4, 3, 2)
    rows = rng.permutation(12)[:5] if mode == "update" else rng.integers(0, 12, 5)
    idx = np.stack([rows // 3, rows % 3], axis=-1).astype(I32)  # (5, 2): slices of (2,)
    upd = rand(rng, 5, 2)

    @program(((4, 3, 2), F32), ((5, 2), F32), ((5, 2), I32))
    def prog(d, u, i):
        return mb.scatter_nd(data=d, indices=i, updates=u, mode=mode)

    (y,) = go(tmp_path, prog, d=data, u=upd, i=idx)
    pos = [(a, b, k) for a, b in idx for k in range(2)]
    np.testing.assert_allclose(y, _scatter_ref(data, pos, upd.reshape(-1), mode), rtol=1e-5,
                               atol=1e-6)


def test_scatter_default_mode_is_add(tmp_path, rng):
    data, upd = rand(rng, 4, 3), rand(rng, 2, 3)
    idx = np.array([1, 1], I32)

    @program(((4, 3), F32), ((2, 3), F32))
    def prog(d, u):
        return mb.scatter(data=d, indices=idx, updates=u)

    (y,) = go(tmp_path, prog, d=data, u=upd)
    want = data.astype(np.float64)
    want[1] += upd[0].astype(np.float64) + upd[1]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def _div_on_int32(d):
    u = mb.slice_by_size(x=d, begin=[0, 0], size=[2, 3])
    return mb.scatter(data=d, indices=np.array([0, 2], I32), updates=u, mode="div")


def _squeeze_with_computed_begin(d):
    begin = mb.mul(x=np.array([1, 0], I32), y=np.int32(1))
    return mb.slice_by_index(x=d, begin=begin, end=np.array([2, 3], I32),
                             squeeze_mask=np.array([True, False]))


@pytest.mark.parametrize("make,match", [(_div_on_int32, "'mode': 'div' on i32"),
                                        (_squeeze_with_computed_begin, "'squeeze_mask'")])
def test_unsupported_parameters_fail(tmp_path, rng, make, match):
    # a form kiln does not map fails naming the parameter instead of computing something else
    data = rng.integers(1, 9, (4, 3)).astype(I32)
    path = save(program(((4, 3), I32))(make), tmp_path / "m.mlpackage")
    with pytest.raises(kiln.ValueError, match=match) as e:
        run(path, {"d": data})
    assert e.value.args[0].startswith("[coreml] op ")


# ---- generated values, selection, sorting ----

def test_select_broadcasts(tmp_path, rng):
    # (a bool input reaches the model as float32, cast to bool inside)
    cond = rng.random((3, 1)) > 0.5
    a, b = rand(rng, 3, 4), rand(rng, 4)

    @program(((3, 1), np.bool_), ((3, 4), F32), ((4,), F32))
    def prog(c, a, b):
        return mb.select(cond=c, a=a, b=b)

    (y,) = go(tmp_path, prog, c=cond.astype(F32), a=a, b=b)
    np.testing.assert_array_equal(y, np.where(cond, a, b))


def test_fill_fill_like_range(tmp_path, rng):
    x = rand(rng, 2, 3)
    v = float(rng.uniform(-5, 5))

    @program(((2, 3), F32))
    def prog(x):
        return (mb.fill(shape=[3, 2], value=np.float32(v)),
                mb.fill(shape=mb.shape(x=x), value=np.int32(4)),
                mb.fill_like(ref_tensor=x, value=np.float32(v)),
                mb.range_1d(start=np.float32(-1.5), end=np.float32(2.0), step=np.float32(0.5)),
                mb.range_1d(start=np.int32(7), end=np.int32(-2), step=np.int32(-3)),
                mb.add(x=x, y=mb.fill_like(ref_tensor=x, value=np.float32(1.0))))

    f1, f2, fl, r1, r2, xp = go(tmp_path, prog, x=x)
    np.testing.assert_array_equal(f1, np.full((3, 2), v, F32))
    assert f2.dtype == np.int32
    np.testing.assert_array_equal(f2, np.full((2, 3), 4))
    np.testing.assert_array_equal(fl, np.full((2, 3), v, F32))
    np.testing.assert_allclose(r1, np.arange(-1.5, 2.0, 0.5))
    np.testing.assert_array_equal(r2, np.arange(7, -2, -3))
    np.testing.assert_array_equal(xp, x + 1)


def test_range_1d_computed(tmp_path, rng):
    x = rand(rng, 6, 2)

    @program(((6, 2), F32))
    def prog(x):
        n = mb.gather(x=mb.shape(x=x), indices=np.int32(0))
        return mb.range_1d(start=np.int32(1), end=n, step=np.int32(2))

    (y,) = go(tmp_path, prog, x=x)
    np.testing.assert_array_equal(y, np.arange(1, 6, 2))


@pytest.mark.parametrize("lower,upper", [(0, -1), (-1, 0), (0, 0), (1, 2), (-1, -1)])
def test_band_part(tmp_path, rng, lower, upper):
    x = rand(rng, 2, 4, 5)

    @program(((2, 4, 5), F32))
    def prog(x):
        return mb.band_part(x=x, lower=lower, upper=upper)

    (y,) = go(tmp_path, prog, x=x)
    m, n = np.indices((4, 5))
    keep = ((lower < 0) | (m - n <= lower)) & ((upper < 0) | (n - m <= upper))
    np.testing.assert_array_equal(y, np.where(keep, x, 0))


@pytest.mark.parametrize("axis,exclusive,reverse", [(0, False, False), (-1, True, False),
                                                    (1, False, True), (1, True, True)])
def test_cumsum(tmp_path, rng, axis, exclusive, reverse):
    x = rng.integers(-9, 9, (3, 5)).astype(I32)

    @program(((3, 5), I32))
    def prog(x):
        return mb.cumsum(x=x, axis=axis, exclusive=exclusive, reverse=reverse)

    (y,) = go(tmp_path, prog, x=x)
    w = np.flip(x, axis) if reverse else x
    w = np.cumsum(w, axis=axis) - (w if exclusive else 0)
    np.testing.assert_array_equal(y, np.flip(w, axis) if reverse else w)


@pytest.mark.parametrize("k,axis,ascending", [(2, -1, False), (3, 0, True), (1, 1, False)])
def test_topk(tmp_path, rng, k, axis, ascending):
    x = rng.permutation(60).reshape(4, 3, 5).astype(F32)  # distinct values: one right answer

    @program(((4, 3, 5), F32))
    def prog(x):
        return mb.topk(x=x, k=k, axis=axis, ascending=ascending)

    v, i = go(tmp_path, prog, x=x)
    order = np.argsort(x if ascending else -x, axis=axis)
    want_i = np.take(order, np.arange(k), axis=axis)
    assert i.dtype == np.int32
    np.testing.assert_array_equal(i, want_i)
    np.testing.assert_array_equal(v, np.take_along_axis(x, want_i, axis=axis))


def test_topk_values_only_ios17(tmp_path, rng):
    x = rng.permutation(12).reshape(3, 4).astype(F32)

    @program(((3, 4), F32), target=IOS17)
    def prog(x):
        return mb.topk(x=x, k=4, return_indices=False)

    (v,) = go(tmp_path, prog, target=IOS17, x=x)
    np.testing.assert_array_equal(v, -np.sort(-x, axis=-1))


@pytest.mark.parametrize("axis,ascending", [(-1, False), (0, True)])
def test_argsort(tmp_path, rng, axis, ascending):
    x = rng.permutation(20).reshape(4, 5).astype(I32)

    @program(((4, 5), I32))
    def prog(x):
        return mb.argsort(x=x, axis=axis, ascending=ascending)

    (y,) = go(tmp_path, prog, x=x)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, np.argsort(x if ascending else -x, axis=axis))


@pytest.mark.parametrize("axis", [-1, 0, 1, -2])
def test_one_hot(tmp_path, rng, axis):
    idx = rng.integers(0, 4, (2, 3)).astype(I32)

    @program(((2, 3), I32))
    def prog(i):
        return mb.one_hot(indices=i, one_hot_vector_size=4, axis=axis,
                          on_value=np.float32(2.5), off_value=np.float32(-1.0))

    (y,) = go(tmp_path, prog, i=idx)
    want = np.where(np.eye(4, dtype=bool)[idx], 2.5, -1.0).astype(F32)  # new axis last
    np.testing.assert_array_equal(y, np.moveaxis(want, -1, axis if axis >= 0 else axis + 3))


# ---- flexible input dims ----

def test_flexible_dims(tmp_path, rng):
    # dims unknown while importing: shape_of feeds reshape, fill, fill_like, one_hot's size, the
    # interleaved concat's reshape and the computed pads, reps and bounds; the dims are given
    # when compiling
    from coremltools.converters.mil.mil import get_new_symbol

    b, t = get_new_symbol(), get_new_symbol()
    x = rand(rng, 2, 3, 4)

    @program(((b, t, 4), F32))
    def prog(x):
        one = np.int32(1)
        pads = mb.mul(x=np.array([0, 0, 1, 2, 0, 1], I32), y=one)
        begin = mb.sub(x=mb.shape(x=x), y=np.array([2, 2, 3], I32))
        return (mb.reshape(x=x, shape=[0, -1, 2]), mb.flatten2d(x=x, axis=1),
                mb.flatten2d(x=x, axis=2), mb.shape(x=x),
                mb.fill_like(ref_tensor=x, value=np.float32(3)),
                mb.concat(values=(x, x), axis=1, interleave=True),
                mb.band_part(x=x, lower=0, upper=1), mb.pad(x=x, pad=pads),
                mb.tile(x=x, reps=mb.mul(x=np.array([1, 2, 1], I32), y=one)),
                mb.slice_by_size(x=x, begin=begin, size=np.array([-1, 1, 2], I32)),
                mb.squeeze(x=mb.expand_dims(x=x, axes=[1]), axes=[1]),
                mb.reshape(x=x, shape=[-1, 4]), mb.fill(shape=mb.shape(x=x), value=np.float32(2)),
                mb.one_hot(indices=np.array([2, 0], I32),
                           one_hot_vector_size=mb.gather(x=mb.shape(x=x), indices=np.int32(1))))

    m = kiln.coreml.load(save(prog, tmp_path / "m.mlpackage"))
    assert m.inputs[0].shape == [-1, -1, 4]
    got = [o.numpy() for o in m.compile(device="cpu", shapes={"x": [2, 3, 4]}).run({"x": x})]
    m_, n_ = np.indices((3, 4))
    want = [x.reshape(2, 6, 2), x.reshape(2, 12), x.reshape(6, 4), np.array([2, 3, 4], I32),
            np.full_like(x, 3), np.stack([x, x], 2).reshape(2, 6, 4),
            np.where((m_ - n_ <= 0) & (n_ - m_ <= 1), x, 0),
            np.pad(x, [(0, 0), (1, 2), (0, 1)]), np.tile(x, (1, 2, 1)), x[:, 1:2, 1:3], x,
            x.reshape(6, 4), np.full_like(x, 2), np.eye(3, dtype=I32)[[2, 0]]]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
