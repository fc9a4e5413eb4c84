"""ATen -> kiln lowerings of kiln.torch, one function per op (kiln/torch.py uses the table).

Each takes (ctx, *args, **kwargs) with fx nodes already replaced by kiln tensors (or tuples of
them) and Python values, and returns a kiln tensor or a tuple of them. Backward ops are written
with kiln ops or kiln.gradients of the matching forward op.
"""
from __future__ import annotations

import functools
import operator
from typing import Any, Callable

import kiln
from kiln import _torch_sym as sym
from kiln._torch_sym import INT64_MAX, is_sym

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

_TORCH_TO_KILN = {}
if torch is not None:
    _TORCH_TO_KILN = {
        torch.float32: kiln.f32, torch.float16: kiln.f16, torch.bfloat16: kiln.bf16,
        torch.float64: kiln.f64, torch.int8: kiln.i8, torch.uint8: kiln.u8,
        torch.int16: kiln.i16, torch.int32: kiln.i32, torch.int64: kiln.i64,
        torch.bool: kiln.bool_,
    }


class LoweringError(kiln.UnsupportedError):
    """A node the lowering cannot express in kiln (the partition falls back to PyTorch)."""


# ------------------------------------------------------------------------------------------------
# ATen -> kiln, one function per op. Each takes (ctx, *args, **kwargs) with fx nodes already
# replaced by kiln tensors (or lists of them) and returns a kiln tensor or a tuple of them.

_LOWERINGS: dict[Any, Callable] = {}


def _op_name(target) -> str:
    return str(getattr(target, "__name__", target))


def _lowers(*names):
    def register(fn):
        for n in names:
            _LOWERINGS[n] = fn
        return fn
    return register


class _Ctx:
    def __init__(self, graph: "kiln.Graph"):
        self.g = graph

    def t(self, v, like=None, dtype=None):
        """A kiln tensor from a lowered value, a run-time size or a Python number (as a scalar
        of like's dtype)."""
        if isinstance(v, kiln.Tensor):
            return v
        if is_sym(v):
            return v.as_dtype(dtype or (like.dtype if like is not None else kiln.i64))
        if dtype is None:
            if like is not None and (like.dtype.is_floating or isinstance(v, (bool, int))):
                dtype = like.dtype
            elif isinstance(v, bool):
                dtype = kiln.bool_
            elif isinstance(v, int):
                dtype = kiln.i64
            else:
                dtype = kiln.f32
        return self.g.scalar(float(v), dtype)

    def dim(self, x, i):
        """Dim i of x: an int, or a Sym where it is known only at run time."""
        return sym.dim(self.g, x, i)

    def shape_arg(self, sizes):
        """Sizes (ints and Syms) as kiln's builders take a shape: ints, or an int64 tensor."""
        return sym.shape_arg(self.g, sizes)

    def shape_of(self, x):
        return sym.shape_of(self.g, x)


def _axes(dims, rank):
    if dims is None:
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return [d % rank if rank else 0 for d in dims]


def _binary(fn):
    def lower(ctx, a, b, *args, alpha=1, **kw):
        if not isinstance(a, kiln.Tensor):
            a = ctx.t(a, like=b)
        b = ctx.t(b, like=a)
        if alpha != 1:
            b = kiln.mul(b, ctx.t(alpha, like=b))
        return fn(a, b)
    return lower


for _name, _fn in {
    "add": kiln.add, "sub": kiln.sub, "mul": kiln.mul, "div": kiln.div, "pow": kiln.pow,
    "maximum": kiln.maximum, "minimum": kiln.minimum, "eq": kiln.equal, "ne": kiln.not_equal,
    "lt": kiln.less, "le": kiln.less_equal, "gt": kiln.greater, "ge": kiln.greater_equal,
    "logical_and": kiln.logical_and, "logical_or": kiln.logical_or, "remainder": kiln.mod,
    # bitwise ops of bools are the logical ones (kiln's bitwise ops take integers)
    "bitwise_and": lambda a, b: (kiln.logical_and if a.dtype == kiln.bool_ else kiln.bitwise_and)(a, b),
    "bitwise_or": lambda a, b: (kiln.logical_or if a.dtype == kiln.bool_ else kiln.bitwise_or)(a, b),
    "bitwise_xor": lambda a, b: (kiln.logical_xor if a.dtype == kiln.bool_ else kiln.bitwise_xor)(a, b),
}.items():
    _lowers(*[f"{_name}.{o}" for o in ("Tensor", "Scalar", "Tensor_Scalar", "Tensor_Tensor", "default", "self")])(
        _binary(_fn))


def _true_div(a, b):
    # PyTorch's div is true division for integers too (kiln's floors)
    if not a.dtype.is_floating and not b.dtype.is_floating:
        a, b = kiln.cast(a, kiln.f32), kiln.cast(b, kiln.f32)
    return kiln.div(a, b)


_lowers("div.Tensor", "div.Scalar")(_binary(_true_div))


@_lowers("rsub.Scalar", "rsub.Tensor")
def _rsub(ctx, a, b, alpha=1):
    if alpha != 1:
        a = kiln.mul(a, ctx.t(alpha, like=a))
    return kiln.sub(ctx.t(b, like=a), a)


@_lowers("pow.Scalar")
def _pow_scalar(ctx, a, b):
    return kiln.pow(ctx.t(a, like=b), b)


for _name, _fn in {
    "relu": kiln.relu, "neg": kiln.neg, "exp": kiln.exp, "log": kiln.log, "sqrt": kiln.sqrt,
    "rsqrt": kiln.rsqrt, "tanh": kiln.tanh, "sigmoid": kiln.sigmoid, "abs": kiln.abs,
    "sin": kiln.sin, "cos": kiln.cos, "erf": kiln.erf, "reciprocal": kiln.reciprocal,
    "silu": kiln.silu, "logical_not": kiln.logical_not, "log1p": kiln.log1p,
    "expm1": kiln.expm1, "floor": kiln.floor, "ceil": kiln.ceil, "sign": kiln.sign,
    "isnan": kiln.isnan, "hardswish": kiln.hardswish,
}.items():
    _lowers(f"{_name}.default")(lambda ctx, x, _fn=_fn: _fn(x))


@_lowers("gelu.default")
def _gelu(ctx, x, approximate="none"):
    return kiln.gelu(x, kiln.GeluApprox.tanh if approximate == "tanh" else kiln.GeluApprox.none)


@_lowers("leaky_relu.default")
def _leaky_relu(ctx, x, negative_slope=0.01):
    return kiln.leaky_relu(x, negative_slope)


def _clip(x, lo, hi):
    return kiln.clip(x, float("-inf") if lo is None else lo, float("inf") if hi is None else hi)


@_lowers("clamp.default")
def _clamp(ctx, x, min=None, max=None):  # noqa: A002 - the schema's names
    return _clip(x, min, max)


@_lowers("hardtanh.default")
def _hardtanh(ctx, x, min_val=-1.0, max_val=1.0):
    return _clip(x, min_val, max_val)


@_lowers("clamp_min.default")
def _clamp_min(ctx, x, min):  # noqa: A002
    return _clip(x, min, None)


@_lowers("clamp_max.default")
def _clamp_max(ctx, x, max):  # noqa: A002
    return _clip(x, None, max)


@_lowers("where.self", "where.ScalarOther", "where.ScalarSelf", "where.Scalar")
def _where(ctx, c, a, b):
    like = a if isinstance(a, kiln.Tensor) else b if isinstance(b, kiln.Tensor) else None
    return kiln.where(c, ctx.t(a, like=like), ctx.t(b, like=like))


@_lowers("masked_fill.Scalar")
def _masked_fill(ctx, x, mask, value):
    return kiln.masked_fill(x, mask, value)


@_lowers("_to_copy.default", "to.dtype", "_to_copy", "convert_element_type.default")
def _to_copy(ctx, x, dtype=None, **kw):
    if dtype is None:
        return x
    return kiln.cast(x, _TORCH_TO_KILN[dtype])


@_lowers("clone.default", "alias.default", "detach.default", "lift_fresh_copy.default",
         "contiguous.default", "_assert_tensor_metadata.default")
def _identity(ctx, x, *args, **kw):
    return x


@_lowers("view.default", "_unsafe_view.default", "reshape.default", "view_copy.default")
def _view(ctx, x, shape):
    shape = list(shape)
    at = [i for i, s in enumerate(shape) if is_sym(s)]
    if len(at) == 1 and -1 not in shape:  # the one run-time size is what the others leave
        shape[at[0]] = -1
    return kiln.reshape(x, ctx.shape_arg(shape))


@_lowers("permute.default")
def _permute(ctx, x, dims):
    return kiln.permute(x, [d % x.ndim for d in dims])


@_lowers("t.default")
def _t(ctx, x):
    return x if x.ndim < 2 else kiln.transpose(x, [1, 0])


@_lowers("transpose.int")
def _transpose(ctx, x, a, b):
    perm = list(range(x.ndim))
    a, b = a % x.ndim, b % x.ndim
    perm[a], perm[b] = perm[b], perm[a]
    return kiln.permute(x, perm)


@_lowers("unsqueeze.default")
def _unsqueeze(ctx, x, dim):
    return kiln.expand_dims(x, [dim % (x.ndim + 1)])


@_lowers("squeeze.dim", "squeeze.dims", "squeeze.default")
def _squeeze(ctx, x, dims=None):
    axes = [a for a in _axes(dims, x.ndim) if x.shape[a] == 1] if dims is not None else []
    if dims is not None and not axes:
        return x
    return kiln.squeeze(x, axes)


@_lowers("expand.default", "expand_copy.default")
def _expand(ctx, x, sizes, implicit=False):
    lead = len(sizes) - x.ndim
    shape = [ctx.dim(x, i - lead) if not is_sym(s) and s == -1 else s for i, s in enumerate(sizes)]
    shape = ctx.shape_arg(shape)
    return kiln.expand(x, shape) if isinstance(shape, kiln.Tensor) else kiln.broadcast_to(x, shape)


@_lowers("cat.default")
def _cat(ctx, xs, dim=0):
    xs = [x for x in xs if not (x.ndim == 1 and x.shape[0] == 0)]
    return kiln.concat(xs, dim % xs[0].ndim)


@_lowers("stack.default")
def _stack(ctx, xs, dim=0):
    return kiln.stack(xs, dim % (xs[0].ndim + 1))


@_lowers("split.Tensor", "split_with_sizes.default")
def _split(ctx, x, sizes, dim=0):
    dim = dim % x.ndim
    n = x.shape[dim]
    if n < 0 or any(is_sym(s) for s in ([sizes] if not isinstance(sizes, (list, tuple)) else sizes)):
        raise LoweringError("[kiln.torch] split along a dim known only at run time")
    if isinstance(sizes, int):
        sizes = [min(sizes, n - i) for i in range(0, n, sizes)]
    return tuple(kiln.split(x, list(sizes), dim)) if len(sizes) > 1 else (x,)


@_lowers("select.int")
def _select(ctx, x, dim, index):
    dim = dim % x.ndim
    if x.shape[dim] >= 0 and not is_sym(index):
        index = index % x.shape[dim]
        return kiln.squeeze(kiln.slice(x, [index], [index + 1], [1], [dim]), [dim])
    # a dim known only at run time (a negative index counts from its end): a gather by a 0-d
    # index drops the dim
    return kiln.gather(x, ctx.t(index, dtype=kiln.i64), dim)


def _slice_dim(ctx, x, dim, start, stop, step):
    if is_sym(start) or is_sym(stop):  # both bounds as int64 tensors
        start, stop = (ctx.shape_arg([v]) if is_sym(v) else sym.ints(ctx.g, [v]) for v in (start, stop))
        return kiln.slice(x, start, stop, [step], [dim])
    return kiln.slice(x, [start], [stop], [step], [dim])


@_lowers("slice.Tensor")
def _slice(ctx, x, dim=0, start=None, end=None, step=1):
    dim = dim % x.ndim
    n = x.shape[dim]
    start = 0 if start is None else start
    end = INT64_MAX if end is None else end
    if n >= 0 and not is_sym(end) and end > n:
        end = n
    return _slice_dim(ctx, x, dim, start, end, step)


@_lowers("select_backward.default")
def _select_backward(ctx, g, input_sizes, dim, index):
    dim = dim % len(input_sizes)
    if not is_sym(index) and index < 0:
        index = index + input_sizes[dim]
    pads = [0] * (2 * len(input_sizes))
    pads[2 * dim], pads[2 * dim + 1] = index, input_sizes[dim] - index - 1
    return kiln.pad(kiln.expand_dims(g, [dim]), ctx.shape_arg(pads))


@_lowers("slice_backward.default")
def _slice_backward(ctx, g, input_sizes, dim, start, end, step):
    dim = dim % len(input_sizes)
    n = input_sizes[dim]
    if not is_sym(start) and start < 0:
        start = start + n
        start = start if is_sym(start) else max(0, start)
    if step != 1:
        raise LoweringError("[kiln.torch] slice_backward with a step")
    pads = [0] * (2 * len(input_sizes))
    pads[2 * dim], pads[2 * dim + 1] = start, n - start - ctx.dim(g, dim)
    return kiln.pad(g, ctx.shape_arg(pads))


_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


@_lowers("nll_loss_forward.default")
def _nll_loss(ctx, x, target, weight, reduction, ignore_index):
    if weight is not None:
        raise LoweringError("[kiln.torch] nll_loss with class weights")
    red = getattr(kiln.Reduction, _REDUCTIONS[reduction])
    out = kiln.nll(x, target, red, ignore_index)
    valid = kiln.not_equal(target, ctx.t(ignore_index, like=target))
    total = kiln.sum(kiln.cast(valid, x.dtype))
    return out, total


@_lowers("nll_loss_backward.default")
def _nll_loss_backward(ctx, g, x, target, weight, reduction, ignore_index, total_weight):
    if weight is not None or x.ndim != 2:
        raise LoweringError("[kiln.torch] nll_loss backward beyond (N, C) without weights")
    hot = kiln.one_hot(target, x.shape[1], 1, x.dtype)
    valid = kiln.cast(kiln.not_equal(target, ctx.t(ignore_index, like=target)), x.dtype)
    hot = kiln.mul(hot, kiln.expand_dims(valid, [1]))
    gb = kiln.expand_dims(g, [1]) if g.ndim == 1 else g
    if reduction == 1:
        gb = kiln.div(gb, total_weight)
    return kiln.neg(kiln.mul(hot, gb))


@_lowers("sum.dim_IntList", "sum.default")
def _sum(ctx, x, dims=None, keepdim=False, dtype=None):
    if dtype is not None:
        x = kiln.cast(x, _TORCH_TO_KILN[dtype])
    return kiln.sum(x, _axes(dims or None, x.ndim), keepdim)


@_lowers("mean.dim", "mean.default")
def _mean(ctx, x, dims=None, keepdim=False, dtype=None):
    if dtype is not None:
        x = kiln.cast(x, _TORCH_TO_KILN[dtype])
    return kiln.mean(x, _axes(dims or None, x.ndim), keepdim)


@_lowers("amax.default")
def _amax(ctx, x, dims=(), keepdim=False):
    return kiln.max(x, _axes(list(dims) or None, x.ndim), keepdim)


@_lowers("amin.default")
def _amin(ctx, x, dims=(), keepdim=False):
    return kiln.min(x, _axes(list(dims) or None, x.ndim), keepdim)


@_lowers("var.correction", "var.dim")
def _var(ctx, x, dims=None, unbiased=None, keepdim=False, correction=None):
    c = correction if correction is not None else (1 if unbiased in (None, True) else 0)
    return kiln.variance(x, _axes(dims, x.ndim), keepdim, int(c))


@_lowers("var_mean.correction")
def _var_mean(ctx, x, dims=None, correction=None, keepdim=False):
    c = 1 if correction is None else int(correction)
    axes = _axes(dims, x.ndim)
    return kiln.variance(x, axes, keepdim, c), kiln.mean(x, axes, keepdim)


@_lowers("argmax.default")
def _argmax(ctx, x, dim=None, keepdim=False):
    if dim is None:
        return kiln.argmax(kiln.reshape(x, [-1]), 0)
    return kiln.argmax(x, dim, keepdim)


@_lowers("mm.default", "bmm.default", "matmul.default")
def _mm(ctx, a, b):
    return kiln.matmul(a, b)


@_lowers("addmm.default")
def _addmm(ctx, bias, a, b, beta=1, alpha=1):
    y = kiln.matmul(a, b)
    if alpha != 1:
        y = kiln.mul(y, ctx.t(alpha, like=y))
    if beta != 1:
        bias = kiln.mul(bias, ctx.t(beta, like=bias))
    return kiln.add(y, bias)


@_lowers("linear.default")
def _linear(ctx, x, w, b=None):
    return kiln.linear(x, w, b)


@_lowers("convolution.default")
def _convolution(ctx, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    nd = x.ndim - 2
    if transposed:
        fn = {1: kiln.conv_transpose1d, 2: kiln.conv_transpose2d, 3: kiln.conv_transpose3d}[nd]
        return fn(x, w, b, list(stride), list(padding), list(output_padding), list(dilation), groups)
    fn = {1: kiln.conv1d, 2: kiln.conv2d, 3: kiln.conv3d}[nd]
    return fn(x, w, b, list(stride), list(padding), list(dilation), groups)


@_lowers("convolution_backward.default")
def _convolution_backward(ctx, dy, x, w, bias_sizes, stride, padding, dilation, transposed,
                          output_padding, groups, output_mask):
    y = _convolution(ctx, x, w, None, stride, padding, dilation, transposed, output_padding, groups)
    dx, dw = kiln.gradients(y, [x, w], dy)
    db = kiln.sum(dy, [0] + list(range(2, dy.ndim))) if output_mask[2] else None
    return (dx if output_mask[0] else None, dw if output_mask[1] else None, db)


@_lowers("_native_batch_norm_legit_no_training.default")
def _bn_eval(ctx, x, w, b, rm, rv, momentum, eps):
    y = kiln.batch_norm(x, rm, rv, w, b, eps)
    return y, _empty(ctx, x), _empty(ctx, x)


def _empty(ctx, like):
    return kiln.zeros(ctx.g, [0], like.dtype)


@_lowers("_native_batch_norm_legit_functional.default", "native_batch_norm.default",
         "_native_batch_norm_legit.default")
def _bn(ctx, x, w, b, rm, rv, training, momentum, eps):
    if not training:
        y = kiln.batch_norm(x, rm, rv, w, b, eps)
        out = (y, _empty(ctx, x), _empty(ctx, x))
        return out + (rm, rv) if ctx.functional_bn else out
    y, mean, var = kiln.batch_norm_train(x, w, b, eps)
    invstd = kiln.rsqrt(kiln.add(var, ctx.t(eps, like=var)))
    out = (y, mean, invstd)
    if rm is None:
        return out
    n = ctx.dim(x, 0)
    for i in range(2, x.ndim):
        n = n * ctx.dim(x, i)
    m = ctx.t(momentum, like=rm)
    keep = ctx.t(1 - momentum, like=rm)
    new_rm = kiln.add(kiln.mul(rm, keep), kiln.mul(kiln.cast(mean, rm.dtype), m))
    if is_sym(n):  # n / (n - 1) at run time (PyTorch's dynamic sizes are at least 2)
        bessel = kiln.div(n.as_dtype(rv.dtype), (n - 1).as_dtype(rv.dtype))
    else:
        bessel = ctx.t(n / max(n - 1, 1), like=rv)
    unbiased = kiln.mul(kiln.cast(var, rv.dtype), bessel)
    new_rv = kiln.add(kiln.mul(rv, keep), kiln.mul(unbiased, m))
    return out + (new_rm, new_rv)


def _per_channel(t, like):
    """A (C) tensor shaped to broadcast over axis 1 of `like`."""
    return kiln.reshape(t, [-1] + [1] * (like.ndim - 2))


@_lowers("native_batch_norm_backward.default")
def _bn_backward(ctx, dy, x, w, rm, rv, save_mean, save_invstd, train, eps, output_mask):
    axes = [0] + list(range(2, x.ndim))
    if train:
        _, mean, var = kiln.batch_norm_train(x, w, None, eps)
        dx, dw, db = kiln.batch_norm_train_grad(dy, x, mean, var, w, eps)
    else:
        invstd = kiln.rsqrt(kiln.add(rv, ctx.t(eps, like=rv)))
        scale = kiln.mul(invstd, w) if w is not None else invstd
        dx = kiln.mul(dy, _per_channel(kiln.cast(scale, dy.dtype), dy))
        xhat = kiln.mul(kiln.sub(x, _per_channel(kiln.cast(rm, x.dtype), x)),
                        _per_channel(kiln.cast(invstd, x.dtype), x))
        dw = kiln.sum(kiln.mul(dy, xhat), axes)
        db = kiln.sum(dy, axes)
    return (dx if output_mask[0] else None, dw if (w is not None and output_mask[1]) else None,
            db if output_mask[2] else None)


@_lowers("native_layer_norm.default")
def _layer_norm(ctx, x, shape, w, b, eps):
    axes = list(range(x.ndim - len(shape), x.ndim))
    y = kiln.layer_norm(x, w, b, -len(shape), eps)
    mean = kiln.mean(x, axes, True)
    rstd = kiln.rsqrt(kiln.add(kiln.variance(x, axes, True), ctx.t(eps, like=x)))
    return y, mean, rstd


@_lowers("native_layer_norm_backward.default")
def _layer_norm_backward(ctx, dy, x, shape, mean, rstd, w, b, output_mask):
    # from the saved mean and rstd: xhat = (x - mean) rstd, g = dy w,
    # dx = rstd / N (N g - sum(g) - xhat sum(g xhat)) over the normalized dims
    axes = list(range(x.ndim - len(shape), x.ndim))
    lead = list(range(x.ndim - len(shape)))
    n = 1
    for d in shape:
        n *= d
    xhat = kiln.mul(kiln.sub(x, mean), rstd)
    g = kiln.mul(dy, w) if w is not None else dy
    sg = kiln.sum(g, axes, True)
    sgx = kiln.sum(kiln.mul(g, xhat), axes, True)
    dx = kiln.mul(kiln.mul(rstd, ctx.t(1.0 / n, like=x)),
                  kiln.sub(kiln.sub(kiln.mul(g, ctx.t(float(n), like=x)), sg), kiln.mul(xhat, sgx)))
    dw = kiln.sum(kiln.mul(dy, xhat), lead) if (w is not None and output_mask[1]) else None
    db = kiln.sum(dy, lead) if (b is not None and output_mask[2]) else None
    return dx if output_mask[0] else None, dw, db


@_lowers("_safe_softmax.default")
def _safe_softmax(ctx, x, dim, dtype=None):
    if dtype is not None:
        x = kiln.cast(x, _TORCH_TO_KILN[dtype])
    return kiln.softmax(x, dim)


@_lowers("_softmax.default", "softmax.int")
def _softmax(ctx, x, dim, half_to_float=False):
    return kiln.softmax(x, dim)


@_lowers("_log_softmax.default", "log_softmax.int")
def _log_softmax(ctx, x, dim, half_to_float=False):
    return kiln.log_softmax(x, dim)


@_lowers("_softmax_backward_data.default")
def _softmax_backward(ctx, g, y, dim, input_dtype):
    s = kiln.sum(kiln.mul(g, y), [dim % y.ndim], True)
    return kiln.mul(y, kiln.sub(g, s))


@_lowers("_log_softmax_backward_data.default")
def _log_softmax_backward(ctx, g, y, dim, input_dtype):
    return kiln.sub(g, kiln.mul(kiln.exp(y), kiln.sum(g, [dim % y.ndim], True)))


@_lowers("threshold_backward.default")
def _threshold_backward(ctx, g, x, threshold):
    return kiln.where(kiln.less_equal(x, ctx.t(threshold, like=x)), ctx.t(0, like=g), g)


@_lowers("gelu_backward.default")
def _gelu_backward(ctx, g, x, approximate="none"):
    return kiln.gradients(_gelu(ctx, x, approximate), [x], g)[0]


@_lowers("tanh_backward.default")
def _tanh_backward(ctx, g, y):
    return kiln.mul(g, kiln.sub(ctx.t(1, like=y), kiln.mul(y, y)))


@_lowers("sigmoid_backward.default")
def _sigmoid_backward(ctx, g, y):
    return kiln.mul(g, kiln.mul(y, kiln.sub(ctx.t(1, like=y), y)))


@_lowers("gather.default")
def _gather(ctx, x, dim, index, sparse_grad=False):
    return kiln.gather_elements(x, index, dim % x.ndim)


def _index_positions(indices):
    """The dims that index.Tensor's index tensors take, when kiln lowers it: consecutive dims
    from the first (the rest None), integer tensors."""
    at = [i for i, t in enumerate(indices) if t is not None]
    return at if at and at == list(range(len(at))) else None


@_lowers("index.Tensor")
def _index(ctx, x, indices):
    """x[i0, i1, ...] by integer tensors on the leading dims: one is a gather along dim 0,
    several a gather_nd of the index tensors broadcast together and stacked."""
    at = _index_positions(indices)
    if at is None or any(indices[i].dtype == kiln.bool_ for i in at):
        raise LoweringError("[kiln.torch] indexing by masks or by tensors after a slice")
    idx = [kiln.cast(indices[i], kiln.i64) for i in at]
    if len(idx) == 1:
        return kiln.gather(x, idx[0], 0)
    # broadcast each to the shape of their sum (elementwise broadcasting, sizes known or not)
    total = functools.reduce(kiln.add, idx)
    zero = kiln.mul(total, ctx.t(0, like=total))
    return kiln.gather_nd(x, kiln.stack([kiln.add(i, zero) for i in idx], -1))


def _index_lowerable(node) -> bool:
    """index.Tensor whose index tensors kiln takes (the others stay with PyTorch)."""
    indices = node.args[1]
    at = _index_positions(indices)
    return at is not None and all(
        getattr(indices[i].meta.get("val"), "dtype", None) not in (None, torch.bool) for i in at)


# Per op, a check of the fx node that must hold for kiln to lower it (kiln/torch.py's supported)
_LOWERABLE = {"index.Tensor": _index_lowerable}


@_lowers("embedding.default")
def _embedding(ctx, w, idx, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return kiln.embedding(w, idx)


@_lowers("embedding_dense_backward.default")
def _embedding_backward(ctx, g, idx, num_weights, padding_idx, scale_grad_by_freq):
    if scale_grad_by_freq:
        raise LoweringError("[kiln.torch] embedding with scale_grad_by_freq")
    return kiln.embedding_grad(idx, g, num_weights, padding_idx)


def _pool_args(kernel, stride, padding, nd):
    k = list(kernel) * (nd if len(kernel) == 1 else 1)
    s = list(stride) if stride else k
    s = s * (nd if len(s) == 1 else 1)
    p = list(padding) * (nd if len(padding) == 1 else 1)
    return k, s, p


@_lowers("max_pool2d_with_indices.default", "max_pool3d_with_indices.default")
def _max_pool(ctx, x, kernel, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    nd = x.ndim - 2
    k, s, p = _pool_args(kernel, stride, padding, nd)
    d = list(dilation) * (nd if len(dilation) == 1 else 1)
    return tuple(kiln.max_pool_with_indices(x, k, s, p, d, ceil_mode))


@_lowers("max_pool2d_with_indices_backward.default", "max_pool3d_with_indices_backward.default")
def _max_pool_backward(ctx, g, x, kernel, stride, padding, dilation, ceil_mode, indices):
    return kiln.max_pool_grad(g, indices, ctx.shape_of(x))


@_lowers("avg_pool2d.default")
def _avg_pool(ctx, x, kernel, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True,
              divisor_override=None):
    if divisor_override is not None:
        raise LoweringError("[kiln.torch] avg_pool2d with divisor_override")
    k, s, p = _pool_args(kernel, stride, padding, x.ndim - 2)
    return kiln.avg_pool(x, k, s, p, ceil_mode, count_include_pad)


@_lowers("avg_pool2d_backward.default")
def _avg_pool_backward(ctx, g, x, kernel, stride, padding, ceil_mode, count_include_pad,
                       divisor_override):
    if divisor_override is not None:
        raise LoweringError("[kiln.torch] avg_pool2d with divisor_override")
    k, s, p = _pool_args(kernel, stride, padding, x.ndim - 2)
    return kiln.avg_pool_grad(g, ctx.shape_of(x), k, s, p, ceil_mode, count_include_pad)


@_lowers("_adaptive_avg_pool2d.default", "adaptive_avg_pool2d.default")
def _adaptive_avg_pool(ctx, x, size):
    return kiln.adaptive_avg_pool(x, list(size))


@_lowers("_adaptive_avg_pool2d_backward.default")
def _adaptive_avg_pool_backward(ctx, g, x):
    return kiln.adaptive_avg_pool_grad(g, ctx.shape_of(x))


@_lowers("native_dropout.default")
def _native_dropout(ctx, x, p, train):
    if train and p > 0:
        raise LoweringError("[kiln.torch] dropout in training mode (random masks stay with PyTorch)")
    return x, _filled(ctx, ctx.shape_of(x), 1, kiln.bool_)


@_lowers("native_dropout_backward.default")
def _native_dropout_backward(ctx, g, mask, scale):
    return kiln.mul(kiln.where(mask, g, ctx.t(0, like=g)), ctx.t(scale, like=g))


def _sdpa_lower(ctx, q, k, v, mask=None, causal=False, scale=None):
    return kiln.scaled_dot_product_attention(q, k, v, mask, causal, scale)


@_lowers("scaled_dot_product_attention.default")
def _sdpa(ctx, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if dropout_p:
        raise LoweringError("[kiln.torch] attention dropout")
    return _sdpa_lower(ctx, q, k, v, attn_mask, is_causal, scale)


@_lowers("full.default", "new_full.default")
def _full(ctx, *args, dtype=None, **kw):
    size, value = (args[-2], args[-1])
    return _filled(ctx, ctx.shape_arg(size), value, _TORCH_TO_KILN[dtype] if dtype else ctx.out_dtype())


def _filled(ctx, shape, value, dtype):
    """A tensor of shape (ints, or an int64 tensor of sizes) filled with value."""
    if isinstance(shape, kiln.Tensor):
        return kiln.full(ctx.g, shape, float(value), dtype)
    if dtype == kiln.bool_:
        return kiln.broadcast_to(ctx.g.scalar(float(bool(value)), kiln.bool_), shape)
    return kiln.full(ctx.g, shape, value, dtype)


@_lowers("zeros.default", "new_zeros.default", "empty.memory_format", "new_empty.default")
def _zeros(ctx, *args, dtype=None, **kw):
    return _filled(ctx, ctx.shape_arg(args[-1]), 0, _TORCH_TO_KILN[dtype] if dtype else ctx.out_dtype())


@_lowers("ones.default", "new_ones.default")
def _ones(ctx, *args, dtype=None, **kw):
    return _filled(ctx, ctx.shape_arg(args[-1]), 1, _TORCH_TO_KILN[dtype] if dtype else ctx.out_dtype())


@_lowers("zeros_like.default", "empty_like.default")
def _zeros_like(ctx, x, dtype=None, **kw):
    return _filled(ctx, ctx.shape_of(x), 0, _TORCH_TO_KILN[dtype] if dtype else x.dtype)


@_lowers("ones_like.default")
def _ones_like(ctx, x, dtype=None, **kw):
    return _filled(ctx, ctx.shape_of(x), 1, _TORCH_TO_KILN[dtype] if dtype else x.dtype)


@_lowers("full_like.default")
def _full_like(ctx, x, value, dtype=None, **kw):
    return _filled(ctx, ctx.shape_of(x), value, _TORCH_TO_KILN[dtype] if dtype else x.dtype)


@_lowers("scalar_tensor.default")
def _scalar_tensor(ctx, value, dtype=None, **kw):
    return ctx.g.scalar(float(value), _TORCH_TO_KILN[dtype] if dtype else kiln.f32)


@_lowers("arange.start_step", "arange.default", "arange.start")
def _arange(ctx, *args, dtype=None, **kw):
    start, end, step = (0, args[0], 1) if len(args) == 1 else (args + (1,))[:3]
    if any(is_sym(v) for v in (start, end, step)):  # int64 values, which shapes follow
        start, end, step = (ctx.t(v, dtype=kiln.i64) for v in (start, end, step))
    return kiln.arange(ctx.g, start, end, step, _TORCH_TO_KILN[dtype] if dtype else ctx.out_dtype())


# sizes: aten.sym_size and the Python operators that combine SymInts (ints where the graph is
# compiled per shape, Syms where sizes are known only at run time)
_lowers("sym_size.int")(lambda ctx, x, i: ctx.dim(x, i))
_lowers("sym_numel.default")(lambda ctx, x: functools.reduce(operator.mul, sym.dims(ctx.g, x), 1))
for _name, _fn in {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
                   "floordiv": operator.floordiv, "mod": operator.mod}.items():
    _lowers(f"operator.{_name}")(lambda ctx, a, b, _fn=_fn: _fn(a, b))
_lowers("operator.neg")(lambda ctx, a: -a)
