"""Core ML test models: MIL programs built with coremltools' builder, saved as .mlpackage
(coremltools writes packages on Linux; it cannot run them here), imported and run by kiln.

The programs keep the ops as written (no coremltools graph passes), so each test reaches the op
it names; references come from numpy in the tests."""
import warnings

import numpy as np

import kiln

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import coremltools as ct  # noqa: E402
    from coremltools.converters.mil import Builder as mb  # noqa: E402,F401

IOS15, IOS16, IOS17, IOS18 = ct.target.iOS15, ct.target.iOS16, ct.target.iOS17, ct.target.iOS18


def _flexible_inputs(prog):
    """TensorTypes for a program whose inputs have symbolic dims: each such dim 1 to 64 (without
    them coremltools declares 1 to 2, which kiln then holds the feeds to)."""
    from coremltools.converters.mil.mil import types
    from coremltools.converters.mil.mil.types.symbolic import is_symbolic

    inputs = prog.functions["main"].inputs
    if not any(is_symbolic(d) for v in inputs.values() for d in v.shape):
        return None
    return [ct.TensorType(name=n, dtype=types.nptype_from_builtin(v.dtype),
                          shape=tuple(ct.RangeDim(1, 64) if is_symbolic(d) else d
                                      for d in v.shape))
            for n, v in inputs.items()]


def save(prog, path, target=IOS16, fp16=False, passes=False):
    """Converts a MIL program (@mb.program) to an ML Program package at `path` and returns it.
    passes: run coremltools' default graph passes (constant folding, fusions), as a real
    conversion does; off by default so the program's ops stay as written. Symbolic input dims
    are declared as 1 to 64."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kw = {}
        if (inputs := _flexible_inputs(prog)) is not None:
            kw["inputs"] = inputs
        if not passes:
            kw["pass_pipeline"] = ct.PassPipeline.EMPTY
        m = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=target,
                       compute_precision=ct.precision.FLOAT16 if fp16 else ct.precision.FLOAT32,
                       **kw)
    m.save(str(path))
    return str(path)


def run(path, feeds, device="cpu", **load_args):
    """Imports the package with kiln and runs it once: the outputs as numpy arrays, in order."""
    m = kiln.coreml.load(str(path), **load_args)
    exe = m.compile(device=device)
    return [o.numpy() for o in exe.run(feeds)]


def program(*specs, target=IOS16):
    """@mb.program with input specs given as (shape, dtype) pairs (numpy dtypes)."""
    types = {np.float32: ct.converters.mil.mil.types.fp32,
             np.float16: ct.converters.mil.mil.types.fp16,
             np.int32: ct.converters.mil.mil.types.int32,
             np.bool_: ct.converters.mil.mil.types.bool}
    input_specs = [mb.TensorSpec(shape=s, dtype=types[np.dtype(d).type]) for s, d in specs]
    return mb.program(input_specs=input_specs, opset_version=target)


def check(tmp_path, prog, feeds, want, target=IOS16, rtol=1e-4, atol=1e-5):
    """Saves `prog`, runs it with kiln on `feeds` and compares its outputs with `want`."""
    got = run(save(prog, tmp_path / "m.mlpackage", target=target), feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g.astype(np.float64), w, rtol=rtol, atol=atol)


def randn(rng, *shape, dtype=np.float32, scale=1.0):
    """Normal random values of `shape` times `scale`, as `dtype`."""
    return (scale * rng.standard_normal(shape)).astype(dtype)
