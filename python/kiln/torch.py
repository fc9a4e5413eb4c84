"""A torch.compile backend that runs captured graphs on kiln.

    model = torch.compile(model, backend=kiln.torch.backend)

AOTAutograd traces the model to ATen graphs (a forward graph, and a backward graph when
gradients are needed). Each graph is split into the parts kiln can lower and the rest: the
supported parts become kiln graphs compiled for the inputs' device (kiln's CUDA device for CUDA
tensors, the CPU otherwise), fed and read back through DLPack without copies; the rest stays
with PyTorch. `kiln.torch.report()` lists what ran where, including every op handed back to
PyTorch. A kiln graph is compiled per input signature (shapes, dtypes, device) on first use.

With `torch.compile(model, backend=kiln.torch.backend, dynamic=True)` the sizes PyTorch marks
dynamic (its SymInts) become named dims of kiln's placeholders, and sizes computed from them
(views to `s0 * s1` rows, `arange(s1)`, ...) become values kiln computes at run time: each
partition is compiled once and runs every size. A partition whose sizes kiln cannot express
symbolically is compiled per shape instead (`report()["dynamic_fallbacks"]` says why).

Backward ops (convolution_backward, native_layer_norm_backward, ...) are lowered through kiln's
own gradients of the matching forward op, so a training step runs on kiln too.
"""
from __future__ import annotations

import logging
import operator
from collections import Counter

import kiln
from kiln import _torch_sym as sym
from kiln._torch_ops import _LOWERABLE, _LOWERINGS, _TORCH_TO_KILN, LoweringError, _Ctx, _op_name

log = logging.getLogger("kiln.torch")

try:
    import torch
    import torch.fx
except ImportError:  # pragma: no cover - the module imports without PyTorch; backend() needs it
    torch = None

# Counts of what the backend lowered and what it handed back to PyTorch (report()).
_stats = {"kiln_nodes": Counter(), "fallback_ops": Counter(), "failed": [], "compiles": 0,
          "dynamic_compiles": 0, "dynamic_fallbacks": []}


def report() -> dict:
    """What the backend did since the last reset(): ops run by kiln, ops handed back to PyTorch
    (unsupported), partitions whose lowering failed (with the error; they ran on PyTorch), the
    kiln graphs compiled (kiln_compiles; dynamic_compiles of them serve every size), and the
    partitions with dynamic sizes compiled per shape instead (dynamic_fallbacks, with why)."""
    return {
        "kiln_ops": dict(_stats["kiln_nodes"]),
        "fallback_ops": dict(_stats["fallback_ops"]),
        "failed_partitions": list(_stats["failed"]),
        "kiln_compiles": _stats["compiles"],
        "dynamic_compiles": _stats["dynamic_compiles"],
        "dynamic_fallbacks": list(_stats["dynamic_fallbacks"]),
    }


def reset() -> None:
    """Clears report()."""
    _stats["kiln_nodes"].clear()
    _stats["fallback_ops"].clear()
    _stats["failed"].clear()
    _stats["dynamic_fallbacks"].clear()
    _stats["compiles"] = _stats["dynamic_compiles"] = 0


_OPERATORS = {operator.getitem: "getitem", operator.add: "operator.add",
              operator.sub: "operator.sub", operator.mul: "operator.mul",
              operator.floordiv: "operator.floordiv", operator.mod: "operator.mod",
              operator.neg: "operator.neg"}


def _target_key(target) -> str | None:
    """'add.Tensor' for torch.ops.aten.add.Tensor; getitem for operator.getitem; operator.mul
    for the Python operators that combine sizes."""
    if target in _OPERATORS:
        return _OPERATORS[target]
    name = getattr(target, "_name", None)  # OpOverload: "aten::add.Tensor"
    if name and name.startswith("aten::"):
        key = name[len("aten::"):]
        return key if "." in key else key + ".default"
    return None


def supported(node) -> bool:
    """Whether the backend lowers this fx node."""
    if node.op != "call_function":
        return True
    key = _target_key(node.target)
    if key == "getitem":  # an item of a supported op's tuple (or a size of a shape)
        src = node.args[0]
        return not isinstance(src, torch.fx.Node) or supported(src)
    if key not in _LOWERINGS or (key in _LOWERABLE and not _LOWERABLE[key](node)):
        return False
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else [val]
    for v in vals:
        if v is not None and hasattr(v, "dtype") and v.dtype not in _TORCH_TO_KILN:
            return False
    return True


# ------------------------------------------------------------------------------------------------
# One fx graph whose every node is supported -> a kiln graph, compiled per input signature.

def _symbolic(v) -> bool:
    return torch is not None and isinstance(v, torch.SymInt)


def _meta_dims(n):
    """A placeholder's dims as PyTorch traced them: ints, and the sympy expressions of SymInts."""
    val = n.meta.get("val")
    if val is None or not hasattr(val, "shape"):
        return None
    return [d.node.expr if _symbolic(d) else int(d) for d in val.shape]


class _LoweredGraph:
    """An fx graph lowered to one compiled kiln graph. dynamic: PyTorch's symbolic sizes stay
    symbolic (named kiln dims, sizes computed at run time), so one executable runs every size;
    otherwise the graph is built for the shapes and ints of `inputs`."""

    def __init__(self, gm: "torch.fx.GraphModule", device: "kiln.Device", inputs, dynamic: bool):
        g = kiln.Graph()
        ctx = _Ctx(g)
        ctx.functional_bn = True
        env: dict = {}
        lowered = Counter()
        self.feeds = []  # (index of the argument, kiln placeholder)
        self.symbols = {}  # symbol name -> (index of the argument, dim), to read sizes at run time
        nodes = list(gm.graph.nodes)
        places = [n for n in nodes if n.op == "placeholder"]
        if len(places) != len(inputs):
            raise LoweringError(f"[kiln.torch] {len(places)} placeholders for {len(inputs)} inputs")
        sizes = {}  # symbol name -> Sym, for sizes computed in the graph
        for i, (n, x) in enumerate(zip(places, inputs)):
            if isinstance(x, torch.Tensor):
                dims = list(x.shape)
                meta = _meta_dims(n) if dynamic else None
                if meta is not None and len(meta) == len(dims):
                    # a symbol names its dim (inputs that share it must agree); an expression
                    # of symbols (s0*s1) is a dim of its own
                    dims = [d if isinstance(d, int) else (str(d) if d.is_Symbol else None) for d in meta]
                t = g.placeholder(dims, _TORCH_TO_KILN[x.dtype], n.name)
                self.feeds.append((i, t))
                env[n] = t
                for k, d in enumerate(dims):
                    if isinstance(d, str) and d not in self.symbols:
                        self.symbols[d] = (i, k)
                        sizes[d] = ctx.dim(t, k)
            elif isinstance(x, (int, torch.SymInt)) and not isinstance(x, bool):
                env[n] = None  # below, once every symbol has its source
            else:
                raise LoweringError(f"[kiln.torch] input {n.name} is not a tensor ({type(x).__name__})")
        for n, x in zip(places, inputs):
            if env[n] is None:
                val = n.meta.get("val")
                env[n] = sym.evaluate(val.node.expr, sizes) if dynamic and _symbolic(val) else int(x)
        for n in nodes:
            ctx.current = _target_key(n.target) if n.op == "call_function" else n.op
            ctx.out_dtype = lambda n=n: _meta_dtype(n) or kiln.f32
            if n.op == "placeholder":
                continue
            if n.op == "get_attr":
                v = _fetch_attr(gm, n.target)
                env[n] = g.constant(kiln.from_dlpack(v.detach().cpu().contiguous()).copy(), n.name)
            elif n.op == "call_function":
                key = _target_key(n.target)
                args = torch.fx.node.map_arg(n.args, lambda a: env[a])
                kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: env[a])
                kwargs = {k: v for k, v in kwargs.items()
                          if k not in ("device", "layout", "pin_memory", "memory_format", "non_blocking")}
                if key == "getitem":
                    env[n] = args[0][args[1]]
                    continue
                out = _LOWERINGS[key](ctx, *args, **kwargs)
                env[n] = _match_meta(ctx, n, out)
                lowered[key] += 1
            elif n.op == "output":
                outs = n.args[0]
                self.single = not isinstance(outs, (tuple, list))
                outs = [outs] if self.single else list(outs)
                self.outputs = [(env[o], o.meta.get("val")) if isinstance(o, torch.fx.Node) else (o, None)
                                for o in outs]
            else:
                raise LoweringError(f"[kiln.torch] fx node kind {n.op}")
        # each output: ("kiln", index of the target), ("input", index of the argument), ("size",
        # its expression, evaluated from the arguments' shapes) or ("value", a constant such as
        # None or a size of a graph compiled per shape)
        inputs_at = {t: i for i, t in self.feeds}
        targets, self.spec = [], []
        for o, val in self.outputs:
            if isinstance(o, kiln.Tensor) and o in inputs_at:
                self.spec.append(("input", inputs_at[o]))
            elif isinstance(o, kiln.Tensor):
                self.spec.append(("kiln", len(targets)))
                targets.append(o)
            elif sym.is_sym(o):
                if not _symbolic(val):
                    raise LoweringError("[kiln.torch] a run-time size output without its expression")
                self.spec.append(("size", val.node.expr))
            else:
                self.spec.append(("value", o))
        self.graph = g
        self.exe = g.compile(targets, device=device) if targets else None
        self.device = device
        self.dynamic = dynamic
        _stats["kiln_nodes"].update(lowered)
        _stats["compiles"] += 1
        _stats["dynamic_compiles"] += int(dynamic)

    def __call__(self, args):
        feeds = {t: kiln.from_dlpack(args[i].detach().contiguous()) for i, t in self.feeds}
        if self.device.kind == kiln.DeviceKind.cuda:
            torch.cuda.current_stream().synchronize()  # inputs written on PyTorch's stream
        results = self.exe.run(feeds) if self.exe is not None else []
        sizes = None
        outs = []
        for kind, v in self.spec:
            if kind == "kiln":
                outs.append(torch.from_dlpack(results[v]))
            elif kind == "input":
                outs.append(args[v])
            elif kind == "size":
                if sizes is None:
                    sizes = {name: int(args[i].shape[k]) for name, (i, k) in self.symbols.items()}
                outs.append(sym.evaluate(v, sizes))
            else:
                outs.append(v)
        return outs[0] if self.single else outs


def _fetch_attr(gm, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _meta_dtype(n, i=None):
    val = n.meta.get("val")
    if i is not None and isinstance(val, (tuple, list)):
        val = val[i]
    if val is None or not hasattr(val, "dtype"):
        return None
    return _TORCH_TO_KILN.get(val.dtype)


def _match_meta(ctx, n, out):
    """Casts results to the dtypes PyTorch infers (0-d tensors do not promote in PyTorch) and
    checks their shapes."""
    val = n.meta.get("val")
    if val is None:
        return out
    if isinstance(out, (tuple, list)):
        vals = val if isinstance(val, (tuple, list)) else [val]
        return tuple(_match_one(ctx, o, v, n) for o, v in zip(out, vals)) + tuple(out[len(vals):])
    return _match_one(ctx, out, val, n)


def _match_one(ctx, o, v, n):
    if not isinstance(o, kiln.Tensor) or v is None or not hasattr(v, "shape"):
        return o
    shape = tuple(None if _symbolic(d) else int(d) for d in v.shape)  # None: a run-time size
    if tuple(o.shape) == (0,) and shape != (0,):
        # an empty stand-in for a result nothing reads (batch norm's saved statistics in
        # inference, whose shape PyTorch picks per device): zeros of PyTorch's shape
        return _zeros_shaped(ctx, o.dtype, n, v)
    if len(o.shape) != len(shape) or any(
            want is not None and have >= 0 and have != want for have, want in zip(o.shape, shape)):
        raise LoweringError(f"[kiln.torch] {n.name} ({n.target}): kiln shape {tuple(o.shape)}, "
                            f"PyTorch shape {tuple(v.shape)}")
    if any(want is not None and have < 0 for have, want in zip(o.shape, shape)):
        # dims PyTorch knows that kiln computes at run time (a view to sizes from values):
        # a reshape that keeps the run-time dims (0: copy) and states the others
        o = kiln.reshape(o, sym.ints(ctx.g, [0 if want is None else want for want in shape]),
                         zero_copies=True)
    want = _TORCH_TO_KILN.get(v.dtype)
    if want is not None and o.dtype != want:
        o = kiln.cast(o, want)
    return o


def _zeros_shaped(ctx, dtype, n, v):
    if any(_symbolic(d) for d in v.shape):
        raise LoweringError(f"[kiln.torch] {n.name} ({n.target}): an unused result of run-time size")
    return kiln.zeros(ctx.g, [int(d) for d in v.shape], dtype)


class _KilnPartition(torch.nn.Module if torch is not None else object):
    """Runs an fx graph on kiln: compiled once for every size where the graph has PyTorch's
    symbolic sizes and kiln can express them, else per input signature; falls back to the graph
    itself when lowering fails (recorded in report())."""

    def __init__(self, gm):
        super().__init__()
        self.gm = gm
        self.cache = {}
        places = [n for n in gm.graph.nodes if n.op == "placeholder"]
        # per placeholder: whether it is a size PyTorch made symbolic (its value varies freely)
        self.sizes = [_symbolic(n.meta.get("val")) for n in places]
        self.dynamic = any(self.sizes) or any(any(_symbolic(d) for d in _meta_dims(n) or [])
                                              for n in places)

    def forward(self, *args):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        dev = tensors[0].device if tensors else torch.device("cpu")
        # dynamic: one entry per dtypes and device (PyTorch's guards fix every static dim); an
        # argument that is not a tensor or a symbolic size is part of the key by its value
        signature = tuple(
            (a.dtype, a.device) if isinstance(a, torch.Tensor)
            else "size" if i < len(self.sizes) and self.sizes[i] else repr(a)
            for i, a in enumerate(args))
        lowered = self.cache.get(("dynamic", signature)) if self.dynamic else None
        if lowered is None and self.dynamic:
            lowered = self._lower(dev, args, True)
            self.cache[("dynamic", signature)] = lowered
        if lowered:
            return lowered(args)
        key = tuple((tuple(a.shape), a.dtype, a.device) if isinstance(a, torch.Tensor) else repr(a)
                    for a in args)
        lowered = self.cache.get(key)
        if lowered is None:
            lowered = self.cache[key] = self._lower(dev, args, False)
        if lowered is False:
            return self.gm(*args)
        return lowered(args)

    def _lower(self, dev, args, dynamic):
        """A _LoweredGraph, or False where lowering fails (dynamic: the caller compiles per
        shape instead; else the partition runs on PyTorch)."""
        try:
            if dev.type == "cuda":
                if kiln.cuda_device_count() == 0:
                    raise LoweringError("[kiln.torch] this kiln build has no CUDA device")
                device = kiln.Device.cuda(dev.index or 0)
            else:
                device = kiln.Device.cpu()
            return _LoweredGraph(self.gm, device, args, dynamic)
        except Exception as e:  # noqa: BLE001 - any failure leaves the partition to PyTorch
            if dynamic:
                log.info("kiln.torch: partition compiled per shape: %s", e)
                _stats["dynamic_fallbacks"].append(f"{type(e).__name__}: {e}")
            else:
                log.warning("kiln.torch: partition falls back to PyTorch: %s", e)
                _stats["failed"].append(f"{type(e).__name__}: {e}")
            return False


def _partition(gm):
    """gm with its supported parts replaced by _KilnPartition modules."""
    unsupported = [n for n in gm.graph.nodes if not supported(n)]
    for n in unsupported:
        _stats["fallback_ops"][_target_key(n.target) or _op_name(n.target)] += 1
    if unsupported:
        log.warning("kiln.torch: ops left to PyTorch: %s",
                    sorted({_target_key(n.target) or _op_name(n.target) for n in unsupported}))
    if not unsupported:
        return _KilnPartition(gm)
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupportBase

    class _Support(OperatorSupportBase):
        def is_node_supported(self, submodules, node):
            return node.op == "call_function" and supported(node)

    partitioner = CapabilityBasedPartitioner(gm, _Support(), allows_single_node_partition=True)
    fused = partitioner.partition_and_fuse()
    for name, mod in list(fused.named_children()):
        if name.startswith("fused_"):
            setattr(fused, name, _KilnPartition(mod))
    fused.recompile()
    return fused


def _compiler(gm, example_inputs):
    from torch._functorch.aot_autograd import make_boxed_func
    return make_boxed_func(_partition(gm))


def backend(gm, example_inputs):
    """The torch.compile backend: torch.compile(model, backend=kiln.torch.backend)."""
    if torch is None:
        raise kiln.UnsupportedError("[kiln.torch] PyTorch is not installed")
    from torch._dynamo.backends.common import aot_autograd
    from torch.nn.attention import SDPBackend, sdpa_kernel
    # attention traced in its math form (matmul, softmax), which kiln lowers with its backward
    with sdpa_kernel([SDPBackend.MATH]):
        return aot_autograd(fw_compiler=_compiler, bw_compiler=_compiler)(gm, example_inputs)
