"""Sizes known only at run time in kiln.torch: PyTorch's SymInts (torch.compile(dynamic=True))
as kiln values computed from shapes.

A graph traced with dynamic sizes names them with symbols (s0, s1, ...): a tensor input has
shape (s0, s1, 128), a size passed on its own is a SymInt placeholder, and sizes are combined
with Python operators (s0 * s1) and read with aten.sym_size. The backend gives each symbol that
is a dim of an input tensor a named kiln dim, so one kiln executable serves every size, and
represents a size inside the graph as a `Sym`: a 0-d int64 kiln tensor read from
`kiln.shape_of`, with Python arithmetic. Lowerings read sizes through `dim()` and pass lists of
sizes through `shape_arg()`, which keeps plain ints where every size is known.
"""
from __future__ import annotations

import functools
import operator

import kiln

INT64_MAX = 2**63 - 1


class SymError(kiln.UnsupportedError):
    """A size expression kiln cannot compute at run time (the partition is compiled per shape)."""


class Sym:
    """A size known at run time: a 0-d int64 kiln tensor, with +, -, *, // and % against ints
    and other Syms (each builds a kiln op)."""

    __slots__ = ("t",)

    def __init__(self, t: "kiln.Tensor"):
        self.t = t

    def _other(self, o):
        if isinstance(o, Sym):
            return o.t
        if isinstance(o, bool) or not isinstance(o, int):
            raise SymError(f"[kiln.torch] a run-time size combined with {type(o).__name__} {o!r}")
        return kiln.scalar_like(self.t, o)

    def _op(self, fn, o, swap=False):
        a, b = self.t, self._other(o)
        return Sym(fn(b, a) if swap else fn(a, b))

    def __add__(self, o):
        return self if not isinstance(o, Sym) and o == 0 else self._op(kiln.add, o)

    def __radd__(self, o):
        return self.__add__(o)

    def __sub__(self, o):
        return self if not isinstance(o, Sym) and o == 0 else self._op(kiln.sub, o)

    def __rsub__(self, o):
        return self._op(kiln.sub, o, swap=True)

    def __mul__(self, o):
        return self if not isinstance(o, Sym) and o == 1 else self._op(kiln.mul, o)

    def __rmul__(self, o):
        return self.__mul__(o)

    def __floordiv__(self, o):  # kiln's integer division floors, as Python's
        return self if not isinstance(o, Sym) and o == 1 else self._op(kiln.div, o)

    def __rfloordiv__(self, o):
        return self._op(kiln.div, o, swap=True)

    def __mod__(self, o):
        return self._op(kiln.mod, o)

    def __neg__(self):
        return Sym(kiln.neg(self.t))

    def _compare(self, o):
        raise SymError("[kiln.torch] a comparison of a run-time size (the graph branches on it)")

    __lt__ = __le__ = __gt__ = __ge__ = _compare

    def __bool__(self):
        raise SymError("[kiln.torch] the truth of a run-time size (the graph branches on it)")

    def __index__(self):
        raise SymError("[kiln.torch] a run-time size used where an int is needed")

    def as_dtype(self, dtype):
        """The size as a 0-d tensor of dtype (for arithmetic with tensors)."""
        return self.t if dtype == kiln.i64 else kiln.cast(self.t, dtype)


def is_sym(v) -> bool:
    return isinstance(v, Sym)


def dim(g: "kiln.Graph", x: "kiln.Tensor", i: int):
    """Dim i of x: an int where kiln knows it while building, else a Sym read at run time."""
    i = i % x.ndim
    d = x.shape[i]
    if d >= 0:
        return d
    return Sym(kiln.gather(kiln.shape_of(x), g.scalar(float(i), kiln.i64)))


def dims(g: "kiln.Graph", x: "kiln.Tensor") -> list:
    return [dim(g, x, i) for i in range(x.ndim)]


def shape_arg(g: "kiln.Graph", sizes):
    """Sizes (ints and Syms) as kiln's builders take a shape: a list of ints where all are
    known, else a 1-d int64 tensor."""
    sizes = list(sizes)
    if not any(is_sym(s) for s in sizes):
        return [int(s) for s in sizes]
    parts, run = [], []
    for s in sizes:
        if is_sym(s):
            if run:
                parts.append(ints(g, run))
                run = []
            parts.append(kiln.reshape(s.t, [1]))
        else:
            run.append(int(s))
    if run:
        parts.append(ints(g, run))
    return parts[0] if len(parts) == 1 else kiln.concat(parts, 0)


def ints(g, values):
    """A 1-d int64 constant (exact for every int64, unlike a float scalar)."""
    import numpy as np

    return g.constant(np.asarray(values, dtype=np.int64))


def shape_of(g: "kiln.Graph", x: "kiln.Tensor"):
    """x's shape as kiln's builders take it: a list where it is static, else shape_of(x)."""
    return list(x.shape) if all(d >= 0 for d in x.shape) else kiln.shape_of(x)


def evaluate(expr, symbols: dict):
    """A SymInt's sympy expression with its symbols replaced by symbols[name] (ints or Syms):
    integers, sums, products, integer powers, floor division and modulo."""
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        name = str(expr)
        if name not in symbols:
            raise SymError(f"[kiln.torch] size {name} is not a dim of any input tensor")
        return symbols[name]
    args = [evaluate(a, symbols) for a in expr.args]
    if expr.is_Add:
        return functools.reduce(operator.add, args)
    if expr.is_Mul:
        return functools.reduce(operator.mul, args)
    if expr.is_Pow and isinstance(args[1], int) and args[1] >= 0:
        return functools.reduce(operator.mul, [args[0]] * args[1], 1)
    kind = type(expr).__name__
    if kind == "FloorDiv":
        return args[0] // args[1]
    if kind in ("Mod", "PythonMod"):
        return args[0] % args[1]
    raise SymError(f"[kiln.torch] size expression {expr} ({kind})")
