"""A torch.compile backend that runs captured graphs on kiln.

    model = torch.compile(model, backend=kiln.torch.backend)

AOTAutograd traces the model to ATen graphs (a forward graph, and a backward graph when
gradients are needed). Each graph is split into the parts kiln can lower and the rest: the
supported parts become kiln graphs compiled for the inputs' device (kiln's CUDA device for CUDA
tensors, the CPU otherwise), fed and read back through DLPack without copies; the rest stays
with PyTorch. `kiln.torch.report()` lists what ran where, including every op handed back to
PyTorch. A kiln graph is compiled per input signature (shapes, dtypes, device) on first use.

Backward ops (convolution_backward, native_layer_norm_backward, ...) are lowered through kiln's
own gradients of the matching forward op, so a training step runs on kiln too.
"""
from __future__ import annotations

import logging
import operator
from collections import Counter

import kiln
from kiln._torch_ops import _LOWERINGS, _TORCH_TO_KILN, LoweringError, _Ctx, _op_name

log = logging.getLogger("kiln.torch")

try:
    import torch
    import torch.fx
except ImportError:  # pragma: no cover - the module imports without PyTorch; backend() needs it
    torch = None

# Counts of what the backend lowered and what it handed back to PyTorch (report()).
_stats = {"kiln_nodes": Counter(), "fallback_ops": Counter(), "failed": []}


def report() -> dict:
    """What the backend did since the last reset(): ops run by kiln, ops handed back to PyTorch
    (unsupported), and partitions whose lowering failed (with the error; they ran on PyTorch)."""
    return {
        "kiln_ops": dict(_stats["kiln_nodes"]),
        "fallback_ops": dict(_stats["fallback_ops"]),
        "failed_partitions": list(_stats["failed"]),
    }


def reset() -> None:
    """Clears report()."""
    _stats["kiln_nodes"].clear()
    _stats["fallback_ops"].clear()
    _stats["failed"].clear()


def _target_key(target) -> str | None:
    """'add.Tensor' for torch.ops.aten.add.Tensor; getitem for operator.getitem."""
    if target is operator.getitem:
        return "getitem"
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
    if key == "getitem":  # an item of a supported op's tuple
        src = node.args[0]
        return not isinstance(src, torch.fx.Node) or supported(src)
    if key not in _LOWERINGS:
        return False
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else [val]
    for v in vals:
        if v is not None and hasattr(v, "dtype") and v.dtype not in _TORCH_TO_KILN:
            return False
    return True


# ------------------------------------------------------------------------------------------------
# One fx graph whose every node is supported -> a kiln graph, compiled per input signature.

class _LoweredGraph:
    def __init__(self, gm: "torch.fx.GraphModule", device: "kiln.Device", inputs):
        g = kiln.Graph()
        ctx = _Ctx(g)
        ctx.functional_bn = True
        env: dict = {}
        lowered = Counter()
        self.placeholders = []
        it = iter(inputs)
        for n in gm.graph.nodes:
            ctx.current = _target_key(n.target) if n.op == "call_function" else n.op
            ctx.out_dtype = lambda n=n: _meta_dtype(n) or kiln.f32
            if n.op == "placeholder":
                x = next(it)
                if not isinstance(x, torch.Tensor):
                    raise LoweringError(f"[kiln.torch] input {n.name} is not a tensor ({type(x).__name__})")
                t = g.placeholder(list(x.shape), _TORCH_TO_KILN[x.dtype], n.name)
                self.placeholders.append(t)
                env[n] = t
            elif n.op == "get_attr":
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
                self.outputs = [env[o] if isinstance(o, torch.fx.Node) else o for o in outs]
            else:
                raise LoweringError(f"[kiln.torch] fx node kind {n.op}")
        # each output: ("kiln", index of the target), ("input", index of the placeholder) or
        # ("value", a constant such as None)
        inputs_at = {t: i for i, t in enumerate(self.placeholders)}
        targets, self.spec = [], []
        for o in self.outputs:
            if isinstance(o, kiln.Tensor) and o in inputs_at:
                self.spec.append(("input", inputs_at[o]))
            elif isinstance(o, kiln.Tensor):
                self.spec.append(("kiln", len(targets)))
                targets.append(o)
            else:
                self.spec.append(("value", o))
        self.graph = g
        self.exe = g.compile(targets, device=device) if targets else None
        self.device = device
        _stats["kiln_nodes"].update(lowered)

    def __call__(self, args):
        feeds = {}
        for t, x in zip(self.placeholders, args):
            feeds[t] = kiln.from_dlpack(x.detach().contiguous())
        if self.device.kind == kiln.DeviceKind.cuda:
            torch.cuda.current_stream().synchronize()  # inputs written on PyTorch's stream
        results = self.exe.run(feeds) if self.exe is not None else []
        outs = []
        for kind, v in self.spec:
            if kind == "kiln":
                outs.append(torch.from_dlpack(results[v]))
            elif kind == "input":
                outs.append(args[v])
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
    shape = tuple(int(d) for d in v.shape)
    if tuple(o.shape) == (0,) and shape != (0,):
        # an empty stand-in for a result nothing reads (batch norm's saved statistics in
        # inference, whose shape PyTorch picks per device): zeros of PyTorch's shape
        return kiln.zeros(ctx.g, list(shape), o.dtype)
    if tuple(o.shape) != shape:
        raise LoweringError(f"[kiln.torch] {n.name} ({n.target}): kiln shape {tuple(o.shape)}, "
                            f"PyTorch shape {shape}")
    want = _TORCH_TO_KILN.get(v.dtype)
    if want is not None and o.dtype != want:
        o = kiln.cast(o, want)
    return o


class _KilnPartition(torch.nn.Module if torch is not None else object):
    """Runs an fx graph on kiln, compiled per input signature; falls back to the graph itself
    when lowering fails (recorded in report())."""

    def __init__(self, gm):
        super().__init__()
        self.gm = gm
        self.cache = {}

    def forward(self, *args):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        dev = tensors[0].device if tensors else torch.device("cpu")
        key = tuple((tuple(a.shape), a.dtype, a.device) if isinstance(a, torch.Tensor) else repr(a)
                    for a in args)
        lowered = self.cache.get(key)
        if lowered is None:
            try:
                if dev.type == "cuda":
                    if kiln.cuda_device_count() == 0:
                        raise LoweringError("[kiln.torch] this kiln build has no CUDA device")
                    device = kiln.Device.cuda(dev.index or 0)
                else:
                    device = kiln.Device.cpu()
                lowered = _LoweredGraph(self.gm, device, args)
            except Exception as e:  # noqa: BLE001 - any failure leaves the partition to PyTorch
                log.warning("kiln.torch: partition falls back to PyTorch: %s", e)
                _stats["failed"].append(f"{type(e).__name__}: {e}")
                lowered = False
            self.cache[key] = lowered
        if lowered is False:
            return self.gm(*args)
        return lowered(args)


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
