"""Core ML test models: MIL programs built with coremltools' builder, saved as .mlpackage
(coremltools writes packages on Linux; it cannot run them here), imported and run by kiln.

The programs keep the ops as written (no coremltools graph passes), so each test reaches the op
it names; references come from numpy in the tests.

KILN_COREML_RECORD=DIR: every model `run` (and so `check`) runs on the CPU without an error is
also written to DIR as one case, for test_coreml_replay.py to run on another device (CUDA, where
coremltools is not installed) against these CPU outputs: DIR/<case>/ holds a copy of the model
(.mlpackage or .mlmodel), feeds.npz (in0, in1, ...), outputs.npz (out0, ...) and case.json (the
pytest node id, a counter for several runs in one test, the load arguments, the tolerances)."""
import hashlib
import json
import os
import re
import shutil
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
    return _run(path, feeds, device, load_args, None)


def _run(path, feeds, device, load_args, tol):
    m = kiln.coreml.load(str(path), **load_args)
    exe = m.compile(device=device)
    outs = [o.numpy() for o in exe.run(feeds)]
    if device == "cpu" and os.environ.get("KILN_COREML_RECORD"):
        record(os.environ["KILN_COREML_RECORD"], m, str(path), feeds, outs, load_args, tol)
    return outs


DEFAULT_TOL = (1e-4, 1e-5)  # rtol, atol of a recorded run without check()'s
FP16_TOL = 2e-2  # the least rtol and atol of a model that computes in fp16
_recorded = {}  # pytest node id -> runs recorded in that test


def _case_name(node_id, index):
    """A directory name for a node id's index-th run: the id made safe for a path (its test file
    and test name first), a hash of the whole id (two ids never share a name) and the index."""
    short = re.sub(r"[^A-Za-z0-9._=-]+", "_", node_id.rsplit("/", 1)[-1]).strip("_")[:100]
    return f"{short}-{hashlib.sha1(node_id.encode()).hexdigest()[:8]}-{index}"


def record(root, model, path, feeds, outs, load_args, tol):
    """Writes one replay case under `root` (see the module's doc): the model at `path` that kiln
    loaded as `model`, its feeds, the CPU outputs `outs`, and the tolerances `tol` ((rtol, atol),
    or None for DEFAULT_TOL), at least FP16_TOL each for a model that computes in fp16."""
    current = os.environ.get("PYTEST_CURRENT_TEST")
    if not current:
        return  # (outside a test: no id to name the case by)
    node_id = current.rsplit(" (", 1)[0]
    index = _recorded.get(node_id, 0)
    _recorded[node_id] = index + 1
    rtol, atol = tol or DEFAULT_TOL
    fp16 = re.search(r"\bf16\(", model.graph.dump()) is not None
    if fp16:
        rtol, atol = max(rtol, FP16_TOL), max(atol, FP16_TOL)
    case = os.path.join(os.path.abspath(root), _case_name(node_id, index))
    shutil.rmtree(case, ignore_errors=True)
    os.makedirs(case)
    name = "model" + os.path.splitext(path.rstrip("/"))[1]
    if os.path.isdir(path):
        shutil.copytree(path, os.path.join(case, name))
    else:
        shutil.copyfile(path, os.path.join(case, name))
    names = list(feeds)
    np.savez(os.path.join(case, "feeds.npz"),
             **{f"in{i}": np.array(v.numpy() if hasattr(v, "numpy") else v)
                for i, v in enumerate(feeds.values())})
    np.savez(os.path.join(case, "outputs.npz"), **{f"out{i}": o for i, o in enumerate(outs)})
    meta = {"id": node_id, "index": index, "model": name, "inputs": names,
            "outputs": [o.name for o in model.outputs],
            "load_args": {k: ({n: [int(d) for d in s] for n, s in v.items()}
                              if k == "input_shapes" else v) for k, v in load_args.items()},
            "rtol": rtol, "atol": atol, "fp16": fp16}
    with open(os.path.join(case, "case.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
        f.write("\n")


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
    got = _run(save(prog, tmp_path / "m.mlpackage", target=target), feeds, "cpu", {},
               (rtol, atol))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g.astype(np.float64), w, rtol=rtol, atol=atol)


def randn(rng, *shape, dtype=np.float32, scale=1.0):
    """Normal random values of `shape` times `scale`, as `dtype`."""
    return (scale * rng.standard_normal(shape)).astype(dtype)
