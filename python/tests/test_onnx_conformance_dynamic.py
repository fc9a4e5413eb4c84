"""ONNX's backend node tests at shapes other than their own: each case whose model kiln runs as
given (docs/conformance.md) is imported again with the leading dim of its float data inputs made a
dim_param, compiled once as a dynamic executable, and run at the case's shape (against the suite's
expected outputs) and with that dim doubled (against onnxruntime, where onnxruntime takes the
doubled shape and agrees with the suite at the case's own). Integer and one-dim inputs (axes,
shapes, scales) are given as values, as the conformance run freezes them."""
import glob
import os
import subprocess
import sys

import numpy as np
import pytest

import kiln

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, numpy_helper  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "onnx_node_tests.py")
FLOATS = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16}
RTOL, ATOL = 1e-3, 1e-4

# Cases kiln runs with static shapes but not with the leading dim dynamic, and why.
EXPECTED = {
    "test_resize_downsample_sizes_nearest_not_larger":
        "keep_aspect_ratio_policy: the scale it computes from x's shape sets the coordinates",
    "test_resize_downsample_sizes_nearest_not_smaller": "keep_aspect_ratio_policy, as above",
    "test_resize_upsample_sizes_nearest_not_larger": "keep_aspect_ratio_policy, as above",
    "test_squeeze": "the dim made dynamic is the one Squeeze removes",
    "test_quantizelinear_blocked_symmetric":
        "its scale shares the data's leading dim and is made dynamic with it, the zero point not",
    "test_resize_upsample_sizes_nearest_not_smaller": "keep_aspect_ratio_policy, as above",
    "test_cumprod_2d_axis_0": "CumProd along the dynamic dim: its doubling steps need the length",
    "test_tensorscatter": "TensorScatter's batch and sequence axes must be known while importing",
    "test_tensorscatter_3d": "as above",
    "test_tensorscatter_circular": "as above",
}
# the function bodies of RotaryEmbedding split x at sizes computed from its shape (kiln's split
# takes sizes known while importing) and those of LinearAttention run a Scan whose outputs' dims
# then come from the data (kiln sizes scan outputs while importing)
EXPECTED.update({f"test_rotary_embedding{v}_expanded": "Split at sizes computed from the shape"
                 for v in ("", "_3d_input", "_interleaved", "_no_position_ids",
                           "_no_position_ids_interleaved", "_no_position_ids_rotary_dim",
                           "_with_interleaved_rotary_dim", "_with_rotary_dim")})
EXPECTED.update({f"test_linear_attention_{v}_expanded": "a Scan output of run-time dims"
                 for v in ("decode_step", "delta", "explicit_scale", "fp16",
                           "gated_delta_beta_scalar", "gated_delta", "gated_delta_gqa",
                           "gated_delta_mqa", "gated", "gated_per_head_decay", "linear",
                           "linear_t1_no_past", "no_past_explicit_zeros", "prefill_with_past")})


def tensors(paths):
    out = []
    for p in sorted(paths, key=lambda p: int(p.rsplit("_", 1)[1][:-3])):
        t = onnx.TensorProto()
        with open(p, "rb") as f:
            t.ParseFromString(f.read())
        out.append(numpy_helper.to_array(t))
    return out


def close(got, want):
    """Whether kiln's outputs match: floats within the tolerances, others exactly (bf16 against
    the suite's raw uint16 bits)."""
    for g, w in zip(got, want):
        g = g.numpy() if hasattr(g, "numpy") else np.asarray(g)
        w = np.asarray(w)
        if g.shape != w.shape:
            return False
        if g.dtype.name == "bfloat16" and w.dtype == np.uint16:
            g = g.view(np.uint16)
        if w.dtype.kind in "fc":
            if not np.allclose(g.astype(np.float64), w.astype(np.float64), rtol=RTOL, atol=ATOL,
                               equal_nan=True):
                return False
        elif not np.array_equal(g, w):
            return False
    return True


def run(model_bytes, frozen, feeds):
    exe = kiln.onnx.load_bytes(model_bytes, input_values=frozen).compile(device="cpu")
    return exe, exe.run({k: v for k, v in feeds.items() if k not in frozen})


@pytest.fixture(scope="module")
def node_dir(tmp_path_factory):
    """The node tests the build wrote (tests/onnx_node_tests), or written here from the onnx
    package's case definitions (scripts/onnx_node_tests.py)."""
    build = os.environ.get("KILN_BUILD_DIR")
    built = os.path.join(build, "tests", "onnx_node_tests", "node") if build else ""
    if built and os.path.isdir(built):
        return built
    out = tmp_path_factory.mktemp("onnx_node_tests")
    subprocess.run([sys.executable, SCRIPT, str(out)], check=True)
    return os.path.join(out, "node")


def cases(node):
    for case in sorted(glob.glob(os.path.join(node, "test_*"))):
        ds = os.path.join(case, "test_data_set_0")
        if os.path.isdir(ds):
            yield case, ds


def dynamic_case(case, ds):
    """None when the case does not apply (no float data input, kiln does not run it as given, a
    non-tensor value); else (name, problem or None, whether the doubled shape ran)."""
    m = onnx.load(os.path.join(case, "model.onnx"))
    init = {i.name for i in m.graph.initializer}
    ins = [i for i in m.graph.input if i.name not in init]
    files = glob.glob(os.path.join(ds, "input_*.pb"))
    if len(files) != len(ins) or not all(i.type.HasField("tensor_type")
                                         for i in list(ins) + list(m.graph.output)):
        return None
    try:
        vals = dict(zip([i.name for i in ins], tensors(files)))
        want = tensors(glob.glob(os.path.join(ds, "output_*.pb")))
    except ValueError:  # (sequences, optionals)
        return None
    floats = [i for i in ins if i.type.tensor_type.elem_type in FLOATS
              and vals[i.name].ndim >= 2 and vals[i.name].shape[0] >= 1]
    if not floats:
        return None
    first = vals[floats[0].name].shape
    dyn = {i.name for i in floats
           if vals[i.name].shape == first or (vals[i.name].shape[0] == first[0] > 1)}
    frozen = {k: v for k, v in vals.items() if k not in dyn}
    try:  # as given, static: what the conformance run does
        _, got = run(m.SerializeToString(), frozen, vals)
        if not close(got, want):
            return None
    except kiln.Error:
        return None
    for i in ins:
        if i.name in dyn:
            d = i.type.tensor_type.shape.dim[0]
            d.ClearField("dim_value")
            d.dim_param = "N"
    for o in m.graph.output:
        if o.type.HasField("tensor_type"):
            o.type.tensor_type.ClearField("shape")
    data = m.SerializeToString()
    big = dict(vals)
    for k in dyn:
        big[k] = np.concatenate([vals[k], np.flip(vals[k], 0)], 0)
    try:
        exe, got = run(data, frozen, vals)
        if not exe.is_dynamic:
            return os.path.basename(case), "not dynamic", False
        if not close(got, want):
            return os.path.basename(case), "differs at the case's shape", False
        try:
            sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
            if not close(sess.run(None, vals), want):
                return os.path.basename(case), None, False  # onnxruntime differs from the suite
            ref = sess.run(None, big)
        except Exception:  # onnxruntime does not take the doubled shape
            return os.path.basename(case), None, False
        got = exe.run({k: v for k, v in big.items() if k not in frozen})
        if not close(got, ref):
            return os.path.basename(case), "differs with the leading dim doubled", True
        return os.path.basename(case), None, True
    except kiln.Error as e:
        return os.path.basename(case), str(e).split("\n")[0], False


def test_node_tests_run_with_a_dynamic_leading_dim(node_dir):
    results = [r for r in (dynamic_case(c, d) for c, d in cases(node_dir)) if r is not None]
    problems = {name: why for name, why, _ in results if why is not None}
    doubled = sum(1 for _, why, ran in results if why is None and ran)
    unexpected = {k: v for k, v in problems.items() if k not in EXPECTED}
    assert not unexpected, f"cases that run as given but not with a dynamic dim: {unexpected}"
    gone = [k for k in EXPECTED if k not in problems]
    assert not gone, f"expected failures that now pass (drop them from EXPECTED): {gone}"
    # (onnx 1.23.2: 1090 of 1122 cases with float data inputs run dynamic; 994 of them doubled too)
    print(f"{len(results) - len(problems)} of {len(results)} cases run dynamic; {doubled} doubled too")
    assert len(results) - len(problems) >= 1000 and doubled >= 900, (len(results), doubled)
