"""Core ML import of NeuralNetwork models (the older .mlmodel format): models built with
coremltools' NeuralNetworkBuilder, imported and run by kiln against numpy (float64) references on
fresh random data. Covers convolution and deconvolution, pooling, the activations, inner product,
embedding, the normalizations, padding, upsampling, the elementwise, reshaping and reduction
layers, the ND layers of exact-rank models, image inputs with their preprocessing, classifiers,
fp16 and quantized weights, and the error that lists unmapped layers."""
import math
import os
import warnings

import coreml_util
import numpy as np
import pytest

import kiln

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import coremltools as ct  # noqa: E402
    from coremltools.models import datatypes  # noqa: E402
    from coremltools.models.neural_network import NeuralNetworkBuilder  # noqa: E402
    from coremltools.models.neural_network.quantization_utils import (  # noqa: E402
        _convert_array_to_nbit_quantized_bytes,
    )

F32 = np.float32


def builder(inputs, outputs=(("y", None),), exact=False, mode=None):
    """A NeuralNetworkBuilder with multiArray inputs and outputs given as (name, shape) pairs."""
    def feats(pairs):
        return [(n, None if s is None else datatypes.Array(*s)) for n, s in pairs]

    return NeuralNetworkBuilder(feats(inputs), feats(outputs), mode=mode,
                                disable_rank5_shape_mapping=exact)


def run(b, tmp_path, feeds, **load_args):
    """Saves the builder's model, imports it with kiln and runs it once on the CPU: the model and
    its outputs."""
    path = str(tmp_path / "m.mlmodel")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ct.utils.save_spec(b.spec, path)
    m = kiln.coreml.load(path, **load_args)
    exe = m.compile(device="cpu")
    # the builder declares multiArray inputs DOUBLE (the layers compute in f32); images are f32
    images = {i.name for i in m.inputs if i.image}
    feeds = {k: np.asarray(v, F32 if k in images else np.float64) for k, v in feeds.items()}
    outs = [o.numpy() for o in exe.run(feeds)]
    if os.environ.get("KILN_COREML_RECORD"):  # a case for the replay on CUDA (coreml_util)
        coreml_util.record(os.environ["KILN_COREML_RECORD"], m, path, feeds, outs, load_args, None)
    return m, outs


def run1(b, tmp_path, x):
    return run(b, tmp_path, {"x": x})[1][0]


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(F32)


def close(got, want, tol=1e-4):
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


# ---- numpy references (float64, one image of shape (C, H, W)) ----

def conv_ref(x, w, b, stride, pads, dil=(1, 1), groups=1):
    x = np.pad(x.astype(np.float64), ((0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    _, h, wd = x.shape
    o, kc, kh, kw = w.shape
    oh = (h - (kh - 1) * dil[0] - 1) // stride[0] + 1
    ow = (wd - (kw - 1) * dil[1] - 1) // stride[1] + 1
    y = np.zeros((o, oh, ow))
    og = o // groups
    for oc in range(o):
        g = oc // og
        for i in range(kh):
            for j in range(kw):
                patch = x[g * kc:(g + 1) * kc,
                          i * dil[0]:i * dil[0] + stride[0] * (oh - 1) + 1:stride[0],
                          j * dil[1]:j * dil[1] + stride[1] * (ow - 1) + 1:stride[1]]
                y[oc] += np.tensordot(w[oc, :, i, j], patch, axes=1)
    return y if b is None else y + b[:, None, None]


def deconv_ref(x, w, b, stride, pads, groups=1):
    c, h, wd = x.shape
    _, og, kh, kw = w.shape
    full = np.zeros((og * groups, (h - 1) * stride[0] + kh, (wd - 1) * stride[1] + kw))
    cg = c // groups
    for g in range(groups):
        xs = x[g * cg:(g + 1) * cg].astype(np.float64)
        for i in range(kh):
            for j in range(kw):
                full[g * og:(g + 1) * og, i:i + stride[0] * (h - 1) + 1:stride[0],
                     j:j + stride[1] * (wd - 1) + 1:stride[1]] += np.einsum(
                    "chw,co->ohw", xs, w[g * cg:(g + 1) * cg, :, i, j])
    y = full[:, pads[0]:full.shape[1] - pads[2], pads[1]:full.shape[2] - pads[3]]
    return y if b is None else y + b[:, None, None]


def pool_ref(x, kind, k, s, pads, ceil=False, exclude=True):
    """Max or average pooling; pads (top, left, bottom, right); ceil: the spec's
    includeLastPixel output size (a window must start inside the input or its top/left pad)."""
    c, h, w = x.shape
    out = []
    dims = ((h, k[0], s[0], pads[0], pads[2]), (w, k[1], s[1], pads[1], pads[3]))
    for n, kk, ss, p0, p1 in dims:
        if ceil:
            o = -(-(n + p0 + p1 - kk) // ss) + 1
            if (p0 or p1) and (o - 1) * ss >= n + p0:
                o -= 1
        else:
            o = (n + p0 + p1 - kk) // ss + 1
        out.append(o)
    y = np.zeros((c, out[0], out[1]))
    for i in range(out[0]):
        for j in range(out[1]):
            h0, w0 = i * s[0] - pads[0], j * s[1] - pads[1]
            h1, w1 = h0 + k[0], w0 + k[1]
            win = x[:, max(h0, 0):min(h1, h), max(w0, 0):min(w1, w)].astype(np.float64)
            if kind == "MAX":
                y[:, i, j] = win.max(axis=(1, 2))
            else:
                count = win.shape[1] * win.shape[2] if exclude else (
                    (min(h1, h + pads[2]) - h0) * (min(w1, w + pads[3]) - w0))
                y[:, i, j] = win.sum(axis=(1, 2)) / count
    return y


# ---- convolution ----

CONVS = {
    # name: (kernel, stride, border, pads (t, b, l, r), groups, dilation, asymmetry)
    "valid_stride2_padded": ((3, 3), (2, 2), "valid", (1, 0, 2, 1), 1, (1, 1), None),
    "same_bottom_right": ((4, 3), (2, 2), "same", None, 1, (1, 1), "BOTTOM_RIGHT_HEAVY"),
    "same_top_left": ((4, 2), (1, 2), "same", None, 1, (1, 1), "TOP_LEFT_HEAVY"),
    "groups_dilation": ((3, 3), (1, 1), "valid", (0, 0, 0, 0), 2, (2, 1), None),
    "depthwise_same": ((3, 3), (1, 1), "same", None, 4, (1, 1), "BOTTOM_RIGHT_HEAVY"),
}


@pytest.mark.parametrize("case", sorted(CONVS))
def test_convolution(rng, tmp_path, case):
    (kh, kw), stride, border, pads, groups, dil, asym = CONVS[case]
    cin, cout, h, w = 4, 6 if groups != 4 else 4, 9, 10
    x = rand(rng, cin, h, w)
    wt = rand(rng, cout, cin // groups, kh, kw)
    bias = rand(rng, cout)
    b = builder([("x", (cin, h, w))])
    kw_ = {}
    if pads:
        kw_ = dict(padding_top=pads[0], padding_bottom=pads[1], padding_left=pads[2],
                   padding_right=pads[3])
    if asym:
        kw_["same_padding_asymmetry_mode"] = asym
    b.add_convolution("conv", cin // groups, cout, kh, kw, stride[0], stride[1], border, groups,
                      wt.transpose(2, 3, 1, 0), bias, True, input_name="x", output_name="y",
                      dilation_factors=list(dil), **kw_)
    if border == "same":
        ek = ((kh - 1) * dil[0] + 1, (kw - 1) * dil[1] + 1)
        p = []
        for n, kk, ss in ((h, ek[0], stride[0]), (w, ek[1], stride[1])):
            total = max((-(-n // ss) - 1) * ss + kk - n, 0)
            p.append(total // 2 if asym == "BOTTOM_RIGHT_HEAVY" else total - total // 2)
            p.append(total - p[-1])
        tlbr = (p[0], p[2], p[1], p[3])
    else:
        tlbr = (pads[0], pads[2], pads[1], pads[3])
    close(run1(b, tmp_path, x), conv_ref(x, wt, bias, stride, tlbr, dil, groups))


@pytest.mark.parametrize("border,groups,out_pad", [("valid", 1, 0), ("same", 1, 0),
                                                   ("valid", 2, 0), ("padded", 1, 1)])
def test_deconvolution(rng, tmp_path, border, groups, out_pad):
    cin, cout, h, w, k, s = 4, 6, 5, 6, 3, 2
    x = rand(rng, cin, h, w)
    wt = rand(rng, cin, cout // groups, k, k)
    bias = rand(rng, cout)
    b = builder([("x", (cin, h, w))])
    kw, pads = {}, (0, 0, 0, 0)
    if border == "padded":  # explicit pads and an outputShape one past them (output_padding)
        kw = dict(padding_top=1, padding_bottom=1, padding_left=1, padding_right=0,
                  output_shape=((h - 1) * s + k - 2 + out_pad, (w - 1) * s + k - 1 + out_pad))
        pads = (1, 1, 1, 0)
    b.add_convolution("deconv", cin, cout, k, k, s, s, "same" if border == "same" else "valid",
                      groups, wt.transpose(2, 3, 0, 1), bias, True, is_deconv=True,
                      input_name="x", output_name="y", **kw)
    if border == "same":  # output H * stride: (k - s) cropped, the smaller half at the top
        t = k - s
        pads = (t // 2, t // 2, t - t // 2, t - t // 2)
    # the full output, zeros past its end (output_padding), cropped by the pads
    full = np.pad(deconv_ref(x, wt, None, (s, s), (0, 0, 0, 0), groups),
                  ((0, 0), (0, out_pad), (0, out_pad))) + bias[:, None, None]
    oh, ow = full.shape[1] - pads[0] - pads[2], full.shape[2] - pads[1] - pads[3]
    got = run1(b, tmp_path, x)
    close(got, full[:, pads[0]:pads[0] + oh, pads[1]:pads[1] + ow])


# ---- pooling ----

POOLS = {
    "max_valid_padded": ("MAX", (3, 3), (2, 2), "VALID", (1, 1, 1, 1), True),
    "avg_valid_include_pad": ("AVERAGE", (3, 2), (2, 1), "VALID", (1, 0, 1, 1), False),
    "avg_valid_exclude_pad": ("AVERAGE", (3, 3), (2, 2), "VALID", (1, 1, 1, 1), True),
    "max_same": ("MAX", (3, 3), (2, 2), "SAME", None, True),
    "avg_same_exclude_pad": ("AVERAGE", (2, 3), (2, 2), "SAME", None, True),
    "max_include_last_pixel": ("MAX", (3, 3), (2, 2), "INCLUDE_LAST_PIXEL", (1, 1, 1, 1), True),
    "avg_include_last_pixel": ("AVERAGE", (3, 3), (2, 2), "INCLUDE_LAST_PIXEL", (1, 1, 1, 1),
                               False),
}


@pytest.mark.parametrize("case", sorted(POOLS))
def test_pooling(rng, tmp_path, case):
    kind, k, s, ptype, pads, exclude = POOLS[case]
    c, h, w = 3, 9, 8
    x = rand(rng, c, h, w)
    b = builder([("x", (c, h, w))])
    kw = {}
    if pads:
        kw = dict(padding_top=pads[0], padding_bottom=pads[2], padding_left=pads[1],
                  padding_right=pads[3])
    b.add_pooling("pool", k[0], k[1], s[0], s[1], kind, ptype, "x", "y",
                  exclude_pad_area=exclude, **kw)
    if ptype == "SAME":
        p = []
        for n, kk, ss in ((h, k[0], s[0]), (w, k[1], s[1])):
            total = max((-(-n // ss) - 1) * ss + kk - n, 0)
            p += [total // 2, total - total // 2]
        pads = (p[0], p[2], p[1], p[3])
    want = pool_ref(x, kind, k, s, pads, ceil=ptype == "INCLUDE_LAST_PIXEL", exclude=exclude)
    close(run1(b, tmp_path, x), want)


@pytest.mark.parametrize("kind", ["MAX", "AVERAGE"])
def test_global_pooling(rng, tmp_path, kind):
    x = rand(rng, 3, 5, 7)
    b = builder([("x", (3, 5, 7))])
    b.add_pooling("pool", 1, 1, 1, 1, kind, "VALID", "x", "y", is_global=True)
    f = np.max if kind == "MAX" else np.mean
    close(run1(b, tmp_path, x), f(x.astype(np.float64), axis=(1, 2), keepdims=True))


# ---- activations ----

def _softplus(x):
    return np.log1p(np.exp(x))


ACTIVATIONS = {
    "RELU": (None, lambda x, p: np.maximum(x, 0)),
    "LEAKYRELU": ([0.2], lambda x, p: np.where(x >= 0, x, 0.2 * x)),
    "TANH": (None, lambda x, p: np.tanh(x)),
    "SCALED_TANH": ([1.5, 0.7], lambda x, p: 1.5 * np.tanh(0.7 * x)),
    "SIGMOID": (None, lambda x, p: 1 / (1 + np.exp(-x))),
    "SIGMOID_HARD": ([0.3, 0.4], lambda x, p: np.clip(0.3 * x + 0.4, 0, 1)),
    "LINEAR": ([1.7, -0.3], lambda x, p: 1.7 * x - 0.3),
    "ELU": (0.8, lambda x, p: np.where(x >= 0, x, 0.8 * (np.exp(x) - 1))),
    "PRELU": ("alpha", lambda x, p: np.where(x >= 0, x, p[:, None, None] * x)),
    "SOFTPLUS": (None, lambda x, p: _softplus(x)),
    "SOFTSIGN": (None, lambda x, p: x / (1 + np.abs(x))),
    "THRESHOLDEDRELU": (0.25, lambda x, p: np.where(x >= 0.25, x, 0)),
    "PARAMETRICSOFTPLUS": ("alpha_beta", lambda x, p: p[0][:, None, None] * _softplus(
        p[1][:, None, None] * x)),
}


@pytest.mark.parametrize("kind", sorted(ACTIVATIONS))
def test_activation(rng, tmp_path, kind):
    params, ref = ACTIVATIONS[kind]
    x = rand(rng, 4, 3, 5)
    p = None
    if params == "alpha":
        params = p = rng.uniform(0.05, 0.5, 4).astype(F32)
    elif params == "alpha_beta":
        p = [rng.uniform(0.5, 1.5, 4).astype(F32), rng.uniform(0.5, 1.5, 4).astype(F32)]
        params = p
    b = builder([("x", (4, 3, 5))])
    b.add_activation("act", kind, "x", "y", params=params)
    close(run1(b, tmp_path, x), ref(x.astype(np.float64), p))


# ---- inner product, embedding, batchnorm ----

def test_flatten_inner_product(rng, tmp_path):
    x = rand(rng, 3, 2, 4)
    wt, bias = rand(rng, 5, 24), rand(rng, 5)
    b = builder([("x", (3, 2, 4))], [("y", (5,))])
    b.add_flatten("flat", 0, "x", "f")
    b.add_inner_product("ip", wt, bias, 24, 5, True, "f", "y")
    m, (got,) = run(b, tmp_path, {"x": x})
    assert got.shape == (5,) and m.kind == "neuralNetwork"
    assert m.op_histogram == {"flatten": 1, "innerProduct": 1}
    assert m.parameter_count == 5 * 24 + 5
    close(got, wt.astype(np.float64) @ x.reshape(-1) + bias)


def test_inner_product_vector_input(rng, tmp_path):
    x = rand(rng, 6)
    wt = rand(rng, 3, 6)
    b = builder([("x", (6,))], [("y", (3,))])
    b.add_inner_product("ip", wt, None, 6, 3, False, "x", "y")
    close(run1(b, tmp_path, x), wt.astype(np.float64) @ x)


def test_embedding(rng, tmp_path):
    table, bias = rand(rng, 4, 10), rand(rng, 4)
    b = builder([("x", (1,))], [("y", (4,))])
    b.add_embedding("emb", table, bias, 10, 4, True, "x", "y")
    close(run1(b, tmp_path, np.array([7], F32)), table[:, 7].astype(np.float64) + bias)


def test_batchnorm(rng, tmp_path):
    c = 4
    x = rand(rng, c, 3, 5)
    g, be, mu = rand(rng, c), rand(rng, c), rand(rng, c)
    var = rng.uniform(0.5, 2, c).astype(F32)
    b = builder([("x", (c, 3, 5))])
    b.add_batchnorm("bn", c, g, be, mu, var, "x", "y", epsilon=1e-3)
    want = ((x - mu[:, None, None]) / np.sqrt(var[:, None, None].astype(np.float64) + 1e-3)
            * g[:, None, None] + be[:, None, None])
    close(run1(b, tmp_path, x), want)


def test_batchnorm_instance_stats(rng, tmp_path):
    c = 3
    x = rand(rng, c, 4, 5).astype(np.float64)
    g, be = rand(rng, c), rand(rng, c)
    b = builder([("x", (c, 4, 5))])
    b.add_batchnorm("bn", c, g, be, None, None, "x", "y", compute_mean_var=True,
                    instance_normalization=True, epsilon=1e-5)
    mu, var = x.mean(axis=(1, 2), keepdims=True), x.var(axis=(1, 2), keepdims=True)
    want = (x - mu) / np.sqrt(var + 1e-5) * g[:, None, None] + be[:, None, None]
    close(run1(b, tmp_path, x.astype(F32)), want)


# ---- padding, upsampling ----

@pytest.mark.parametrize("kind,np_mode", [("constant", "constant"), ("reflection", "reflect"),
                                          ("replication", "edge")])
def test_padding(rng, tmp_path, kind, np_mode):
    x = rand(rng, 2, 5, 6)
    b = builder([("x", (2, 5, 6))])
    b.add_padding("pad", left=2, right=1, top=1, bottom=3, value=1.5, input_name="x",
                  output_name="y", padding_type=kind)
    kw = {"constant_values": 1.5} if kind == "constant" else {}
    close(run1(b, tmp_path, x), np.pad(x, ((0, 0), (1, 3), (2, 1)), mode=np_mode, **kw))


def bilinear_ref(x, sh, sw, mode):
    c, h, w = x.shape

    def grid(n, s):
        o = np.arange(n * s, dtype=np.float64)
        if mode == "ALIGN_CORNERS_TRUE":
            src = o * (n - 1) / (n * s - 1)
        elif mode == "ALIGN_CORNERS_FALSE":
            src = np.maximum((o + 0.5) / s - 0.5, 0)
        else:
            src = np.minimum(o / s, n - 1)
        i0 = np.minimum(np.floor(src).astype(int), n - 1)
        i1 = np.minimum(i0 + 1, n - 1)
        return i0, i1, src - i0

    h0, h1, fh = grid(h, sh)
    w0, w1, fw = grid(w, sw)
    x = x.astype(np.float64)
    top = x[:, h0][:, :, w0] * (1 - fw) + x[:, h0][:, :, w1] * fw
    bot = x[:, h1][:, :, w0] * (1 - fw) + x[:, h1][:, :, w1] * fw
    return top * (1 - fh[:, None]) + bot * fh[:, None]


@pytest.mark.parametrize("mode", ["NN", "DEFAULT", "ALIGN_CORNERS_TRUE", "ALIGN_CORNERS_FALSE"])
def test_upsample(rng, tmp_path, mode):
    x = rand(rng, 2, 3, 4)
    b = builder([("x", (2, 3, 4))])
    if mode == "NN":
        b.add_upsample("up", 2, 3, "x", "y", mode="NN")
        want = x.repeat(2, axis=1).repeat(3, axis=2)
    else:
        b.add_upsample("up", 2, 3, "x", "y", mode="BILINEAR", linear_upsample_mode=mode)
        want = bilinear_ref(x, 2, 3, mode)
    close(run1(b, tmp_path, x), want)


# ---- elementwise ----

@pytest.mark.parametrize("mode", ["ADD", "MULTIPLY", "AVE", "MAX", "MIN"])
def test_elementwise(rng, tmp_path, mode):
    xs = [rand(rng, 3, 4, 5), rand(rng, 3, 4, 5), rand(rng, 3, 1, 1)]
    b = builder([("a", (3, 4, 5)), ("b", (3, 4, 5)), ("c", (3, 1, 1))])
    b.add_elementwise("op", ["a", "b", "c"], "y", mode)
    f = {"ADD": np.add, "MULTIPLY": np.multiply, "MAX": np.maximum, "MIN": np.minimum}
    x64 = [x.astype(np.float64) for x in xs]
    if mode == "AVE":
        want = (x64[0] + x64[1] + x64[2]) / 3
    else:
        want = f[mode](f[mode](x64[0], x64[1]), x64[2])
    _, (got,) = run(b, tmp_path, {"a": xs[0], "b": xs[1], "c": xs[2]})
    close(got, want)


@pytest.mark.parametrize("mode", ["ADD", "MULTIPLY"])
def test_elementwise_alpha(rng, tmp_path, mode):
    x = rand(rng, 2, 3, 4)
    b = builder([("x", (2, 3, 4))])
    b.add_elementwise("op", ["x"], "y", mode, alpha=-1.25)
    close(run1(b, tmp_path, x), x + -1.25 if mode == "ADD" else x * -1.25)


def test_scale_bias(rng, tmp_path):
    x = rand(rng, 3, 4, 5)
    s, bs, bb = rand(rng, 3), rand(rng, 1, 4, 5), rand(rng, 3, 4, 5)
    b = builder([("x", (3, 4, 5))])
    b.add_scale("scale", s, bs, True, "x", "s", shape_scale=[3], shape_bias=[1, 4, 5])
    b.add_bias("bias", bb, "s", "y", shape_bias=[3, 4, 5])
    close(run1(b, tmp_path, x), x.astype(np.float64) * s[:, None, None] + bs + bb)


UNARY = {
    "sqrt": (lambda x: np.abs(x) + 0.1, {}, np.sqrt),
    "rsqrt": (lambda x: np.abs(x) + 0.1, {"epsilon": 1e-3}, lambda x: 1 / np.sqrt(x + 1e-3)),
    "inverse": (lambda x: np.abs(x) + 0.5, {"epsilon": 1e-4}, lambda x: 1 / (x + 1e-4)),
    "power": (lambda x: np.abs(x) + 0.1, {"alpha": 2.5}, lambda x: x ** 2.5),
    "exp": (lambda x: x, {}, np.exp),
    "log": (lambda x: np.abs(x) + 0.1, {}, np.log),
    "abs": (lambda x: x, {}, np.abs),
    "threshold": (lambda x: x, {"alpha": 0.3}, lambda x: np.maximum(x, 0.3)),
}


@pytest.mark.parametrize("mode", sorted(UNARY))
def test_unary(rng, tmp_path, mode):
    prep, kw, ref = UNARY[mode]
    x = prep(rand(rng, 2, 3, 4)).astype(F32)
    b = builder([("x", (2, 3, 4))])
    b.add_unary("u", "x", "y", mode, shift=0.25, scale=1.5, **kw)
    close(run1(b, tmp_path, x), ref(1.5 * x.astype(np.float64) + 0.25))


# ---- layout ----

def test_concat_split_slice(rng, tmp_path):
    a, c = rand(rng, 2, 3, 4), rand(rng, 4, 3, 4)
    b = builder([("a", (2, 3, 4)), ("c", (4, 3, 4))],
                [("s0", None), ("s1", None), ("h", None)])
    b.add_elementwise("cat", ["a", "c"], "cat", "CONCAT")
    b.add_split("split", "cat", ["s0", "s1"])
    b.add_slice("slice", "cat", "h", "height", start_index=1, end_index=-1, stride=1)
    _, (s0, s1, h) = run(b, tmp_path, {"a": a, "c": c})
    cat = np.concatenate([a, c])
    close(s0, cat[:3])
    close(s1, cat[3:])
    close(h, cat[:, 1:-1])


@pytest.mark.parametrize("mode", [0, 1])
def test_flatten_and_reshape_orders(rng, tmp_path, mode):
    x = rand(rng, 3, 2, 4)
    b = builder([("x", (3, 2, 4))], [("f", None), ("r", None)])
    b.add_flatten("flat", mode, "x", "f")
    b.add_reshape("reshape", "x", "r", (4, 3, 2), mode)
    _, (f, r) = run(b, tmp_path, {"x": x})
    if mode == 0:
        close(f, x.reshape(24, 1, 1))
        close(r, x.reshape(4, 3, 2))
    else:
        close(f, x.transpose(1, 2, 0).reshape(24, 1, 1))
        close(r, x.transpose(1, 2, 0).reshape(3, 2, 4).transpose(2, 0, 1))


def test_permute(rng, tmp_path):
    x = rand(rng, 3, 2, 4)
    b = builder([("x", (3, 2, 4))])
    b.add_permute("perm", (0, 3, 1, 2), "x", "y")
    close(run1(b, tmp_path, x), x.transpose(2, 0, 1))


def test_softmax_load_constant(rng, tmp_path):
    x = rand(rng, 5, 2, 3)
    k = rand(rng, 5, 2, 3)
    b = builder([("x", (5, 2, 3))])
    b.add_load_constant("k", "k", k, (5, 2, 3))
    b.add_elementwise("add", ["x", "k"], "s", "ADD")
    b.add_softmax("sm", "s", "y")
    s = x.astype(np.float64) + k
    e = np.exp(s - s.max(axis=0))
    close(run1(b, tmp_path, x), e / e.sum(axis=0))


@pytest.mark.parametrize("mode,axis", [
    (m, a) for m in ["sum", "avg", "prod", "logsum", "sumsquare", "L1", "L2", "max", "min"]
    for a in ["CHW", "HW", "C", "W"]] + [("argmax", "C"), ("argmax", "W")])
def test_reduce(rng, tmp_path, mode, axis):
    x = rand(rng, 3, 2, 4)
    if mode in ("prod", "logsum"):
        x = (np.abs(x) * 0.5 + 0.5).astype(F32)
    b = builder([("x", (3, 2, 4))])
    b.add_reduce("r", "x", "y", axis, mode, epsilon=1e-6)
    axes = {"CHW": (0, 1, 2), "HW": (1, 2), "C": (0,), "W": (2,)}[axis]
    v = x.astype(np.float64)
    f = {"sum": lambda: v.sum(axes, keepdims=True), "avg": lambda: v.mean(axes, keepdims=True),
         "prod": lambda: v.prod(axes, keepdims=True),
         "logsum": lambda: np.log(v + 1e-6).sum(axes, keepdims=True),
         "sumsquare": lambda: (v * v).sum(axes, keepdims=True),
         "L1": lambda: np.abs(v).sum(axes, keepdims=True),
         "L2": lambda: np.sqrt((v * v).sum(axes, keepdims=True)),
         "max": lambda: v.max(axes, keepdims=True), "min": lambda: v.min(axes, keepdims=True),
         "argmax": lambda: np.expand_dims(v.argmax(axes[0]), axes[0])}
    close(run1(b, tmp_path, x), f[mode]())


# ---- normalizations ----

def test_lrn_l2normalize_mvn(rng, tmp_path):
    x = rand(rng, 6, 3, 4)
    b = builder([("x", (6, 3, 4))], [("lrn", None), ("l2", None), ("mvn", None)])
    b.add_lrn("lrn", "x", "lrn", alpha=0.3, beta=0.75, local_size=3, k=2.0)
    b.add_l2_normalize("l2", "x", "l2", epsilon=1e-6)
    b.add_mvn("mvn", "x", "mvn", across_channels=False, normalize_variance=True, epsilon=1e-5)
    _, (lrn, l2, mvn) = run(b, tmp_path, {"x": x})
    v = x.astype(np.float64)
    sq = np.pad(v * v, ((1, 1), (0, 0), (0, 0)))
    window = sq[:-2] + sq[1:-1] + sq[2:]
    close(lrn, v / (2.0 + 0.3 / 3 * window) ** 0.75)
    close(l2, v / np.sqrt((v * v).sum() + 1e-6))
    mu, var = v.mean(axis=(1, 2), keepdims=True), v.var(axis=(1, 2), keepdims=True)
    close(mvn, (v - mu) / np.sqrt(var + 1e-5))


# ---- ND layers (exact-rank models) ----

def test_nd_layers(rng, tmp_path):
    a, c = rand(rng, 2, 3, 4), rand(rng, 3, 1)
    idx = np.array([2, 0, -1], F32)
    w = rand(rng, 4, 5)
    b = builder([("a", (2, 3, 4)), ("c", (3, 1)), ("i", (3,))],
                [("y", None), ("g", None), ("m", None), ("t", None), ("s", None)], exact=True)
    b.add_add_broadcastable("add", ["a", "c"], "sum")
    b.add_multiply_broadcastable("mul", ["sum", "c"], "prod")
    b.add_concat_nd("cat", ["prod", "a"], "cat", axis=-1)  # (2, 3, 8)
    b.add_reshape_static("rs", "cat", "rs", (6, 8))
    b.add_expand_dims("ed", "rs", "ed", axes=[0])
    b.add_squeeze("sq", "ed", "sq", axes=[0])
    b.add_softmax_nd("sm", "sq", "y", axis=-1)
    b.add_gather("gather", ["a", "i"], "g", axis=1)
    b.add_batched_mat_mul("mm", ["a"], "m", W=w, weight_matrix_rows=4, weight_matrix_columns=5)
    b.add_transpose("tr", (2, 0, 1), "a", "t")
    b.add_slice_static("sl", "a", "s", begin_ids=[0, 1, 0], end_ids=[2, 3, 4],
                       strides=[1, 1, 2], begin_masks=[False] * 3, end_masks=[False] * 3)
    m, (y, g, mm, t, s) = run(b, tmp_path, {"a": a, "c": c, "i": idx})
    v, cv = a.astype(np.float64), c.astype(np.float64)
    cat = np.concatenate([(v + cv) * cv, v], axis=-1).reshape(6, 8)
    e = np.exp(cat - cat.max(axis=-1, keepdims=True))
    close(y, e / e.sum(axis=-1, keepdims=True))
    close(g, v[:, [2, 0, 2]])
    close(mm, v @ w)
    close(t, v.transpose(2, 0, 1))
    close(s, v[0:2, 1:3, 0:4:2])
    assert m.op_histogram["addBroadcastable"] == 1 and m.op_histogram["batchedMatmul"] == 1


# ---- inputs, classifiers, weights ----

@pytest.mark.parametrize("space", ["RGB", "BGR"])
def test_image_input_scale_and_bias(rng, tmp_path, space):
    h, w = 5, 6
    b = builder([("image", (3, h, w))], [("y", None)])
    b.add_activation("id", "LINEAR", "image", "y", params=[1.0, 0.0])
    b.set_pre_processing_parameters(image_input_names=["image"], is_bgr=space == "BGR",
                                    red_bias=-1.5, green_bias=0.25, blue_bias=2.0,
                                    image_scale=1 / 127.5)
    from coremltools.proto import FeatureTypes_pb2 as ft
    im = b.spec.description.input[0].type.imageType
    assert im.colorSpace == (ft.ImageFeatureType.BGR if space == "BGR" else ft.ImageFeatureType.RGB)
    x = rng.integers(0, 256, (1, 3, h, w)).astype(F32)
    m, (got,) = run(b, tmp_path, {"image": x})
    assert m.inputs[0].image == space and list(m.inputs[0].shape) == [1, 3, h, w]
    bias = [-1.5, 0.25, 2.0] if space == "RGB" else [2.0, 0.25, -1.5]
    close(got, x[0] / 127.5 + np.array(bias)[:, None, None])


def test_image_input_mean_image(rng, tmp_path):
    h, w = 4, 3
    b = builder([("image", (1, h, w))], [("y", None)])
    b.add_activation("id", "LINEAR", "image", "y", params=[2.0, 0.0])
    b.set_pre_processing_parameters(image_input_names=["image"], is_bgr=False)
    b.spec.description.input[0].type.imageType.colorSpace = 10  # GRAYSCALE
    pre = b.spec.neuralNetwork.preprocessing[0]
    mean = rng.uniform(0, 255, h * w).astype(F32)
    pre.ClearField("scaler")
    pre.meanImage.meanImage.extend(mean)
    x = rng.integers(0, 256, (1, 1, h, w)).astype(F32)
    m, (got,) = run(b, tmp_path, {"image": x})
    assert m.inputs[0].image == "GRAYSCALE"
    close(got, 2 * (x[0] - mean.reshape(1, h, w)), tol=1e-3)


def test_classifier(rng, tmp_path):
    x = rand(rng, 4)
    wt, bias = rand(rng, 3, 4), rand(rng, 3)
    b = builder([("x", (4,))], [("probs", None)], mode="classifier")
    b.add_inner_product("ip", wt, bias, 4, 3, True, "x", "logits")
    b.add_softmax("sm", "logits", "probs")
    b.set_class_labels(["a", "b", "c"])
    m, (got,) = run(b, tmp_path, {"x": x})
    assert [o.name for o in m.outputs] == ["probs"]
    z = wt.astype(np.float64) @ x + bias
    close(got, np.exp(z) / np.exp(z).sum())


def test_fp16_weights(rng, tmp_path):
    x = rand(rng, 6)
    wt = rand(rng, 4, 6)
    b = builder([("x", (6,))], [("y", (4,))])
    b.add_inner_product("ip", wt, None, 6, 4, False, "x", "y")
    wp = b.spec.neuralNetwork.layers[0].innerProduct.weights
    wp.ClearField("floatValue")
    wp.float16Value = wt.astype(np.float16).tobytes()
    want = wt.astype(np.float16).astype(np.float64) @ x
    close(run1(b, tmp_path, x), want, tol=1e-3)


@pytest.mark.parametrize("kind,nbits", [("linear", 8), ("linear", 4), ("lut", 2), ("lut", 3)])
def test_quantized_weights(rng, tmp_path, kind, nbits):
    cin, cout = 7, 5
    x = rand(rng, cin)
    q = rng.integers(0, 2 ** nbits, (cout, cin))
    raw = bytes(_convert_array_to_nbit_quantized_bytes(q.flatten(), nbits).tobytes())
    b = builder([("x", (cin,))], [("y", (cout,))])
    if kind == "linear":
        scale, qbias = rng.uniform(0.01, 0.1, cout), rng.standard_normal(cout)
        b.add_inner_product("ip", raw, None, cin, cout, False, "x", "y", quantization_type="linear",
                            nbits=nbits, quant_scale=scale, quant_bias=qbias,
                            is_quantized_weight=True)
        wt = q * scale.astype(F32)[:, None] + qbias.astype(F32)[:, None]
    else:
        lut = rng.standard_normal(2 ** nbits).astype(F32)
        b.add_inner_product("ip", raw, None, cin, cout, False, "x", "y", quantization_type="lut",
                            nbits=nbits, quant_lut=lut, is_quantized_weight=True)
        wt = lut[q]
    close(run1(b, tmp_path, x), wt.astype(np.float64) @ x, tol=1e-3)


def test_unmapped_layers_are_listed(rng, tmp_path):
    b = builder([("x", (4, 2, 2))])
    b.add_reorganize_data("s2d", "x", "r", mode="SPACE_TO_DEPTH", block_size=2)
    b.add_sequence_repeat("rep", 2, "r", "q")
    b.add_activation("relu", "RELU", "q", "y")
    path = str(tmp_path / "m.mlmodel")
    ct.utils.save_spec(b.spec, path)
    with pytest.raises(kiln.UnsupportedError) as e:
        kiln.coreml.load(path)
    msg = str(e.value)
    assert "reorganizeData (s2d)" in msg and "relu" not in msg
    assert "sequenceRepeat" not in msg  # it reads the unmapped layer's output
    # a parameter kiln does not map fails naming its layer
    b = builder([("x", (4, 2, 2))])
    b.add_upsample("up", 2, 2, "x", "u", mode="NN")
    b.spec.neuralNetwork.layers[0].upsample.fractionalScalingFactor.extend([1.5, 1.5])
    b.add_activation("relu", "RELU", "u", "y")
    ct.utils.save_spec(b.spec, path)
    with pytest.raises(kiln.UnsupportedError, match="layer 'up' \\(upsample\\)"):
        kiln.coreml.load(path)
    # the same model without it runs
    x = rand(rng, 4)
    b2 = builder([("x", (4,))], [("y", (4,))])
    b2.add_activation("relu", "RELU", "x", "y")
    close(run1(b2, tmp_path, x), np.maximum(x, 0))


def test_nd_layers_more(rng, tmp_path):
    a, c = rand(rng, 2, 3, 4), rand(rng, 2, 5, 4)
    k = (np.abs(rand(rng, 3, 4)) + 0.5).astype(F32)
    table, ids = rand(rng, 6, 10), np.array([[1], [9], [0]], F32)
    g, be = rand(rng, 3, 4), rand(rng, 3, 4)
    outs = ["mm", "sub", "div", "ln", "f2", "emb", "rs", "rm", "sp1", "cl", "ge"]
    b = builder([("a", (2, 3, 4)), ("c", (2, 5, 4)), ("i", (3, 1))],
                [(n, None) for n in outs], exact=True)
    b.add_batched_mat_mul("mm", ["a", "c"], "mm", transpose_b=True)
    b.add_load_constant_nd("k", "k", k, (3, 4))
    b.add_subtract_broadcastable("sub", ["a", "k"], "sub")
    b.add_divide_broadcastable("div", ["a", "k"], "div")
    b.add_layer_normalization("ln", "a", "ln", (3, 4), g, be, eps=1e-5)
    b.add_flatten_to_2d("f2", "a", "f2", axis=1)
    b.add_embedding_nd("emb", "i", "emb", 10, 6, table)
    b.add_reduce_sum("rs", "a", "rs", axes=[-1], keepdims=False)
    b.add_reduce_mean("rm", "a", "rm", axes=[0, 2], keepdims=True)
    b.add_split_nd("sp", "a", ["sp0", "sp1"], axis=2, split_sizes=[1, 3])
    b.add_clip("cl", "a", "cl", min_value=-0.5, max_value=0.25)
    b.add_gelu("ge", "a", "ge", mode="TANH_APPROXIMATION")
    _, got = run(b, tmp_path, {"a": a, "c": c, "i": ids})
    v = a.astype(np.float64)
    mu, var = v.mean(axis=(1, 2), keepdims=True), v.var(axis=(1, 2), keepdims=True)
    want = [v @ c.transpose(0, 2, 1), v - k, v / k, (v - mu) / np.sqrt(var + 1e-5) * g + be,
            v.reshape(2, 12), table[:, [1, 9, 0]].T, v.sum(-1), v.mean((0, 2), keepdims=True),
            v[:, :, 1:], np.clip(v, -0.5, 0.25),
            0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3)))]
    for name, x, y in zip(outs, got, want):
        close(x, y)


def test_exact_rank4_conv_pool_inner_product(rng, tmp_path):
    x = rand(rng, 1, 3, 6, 6)
    wt, bias = rand(rng, 4, 3, 3, 3), rand(rng, 4)
    w2 = rand(rng, 5, 4 * 2 * 2)
    b = builder([("x", (1, 3, 6, 6))], [("y", None)], exact=True)
    b.add_convolution("conv", 3, 4, 3, 3, 1, 1, "valid", 1, wt.transpose(2, 3, 1, 0), bias, True,
                      input_name="x", output_name="c")
    b.add_pooling("pool", 2, 2, 2, 2, "MAX", "VALID", "c", "p")
    b.add_inner_product("ip", w2, None, 16, 5, False, "p", "y")
    m, (got,) = run(b, tmp_path, {"x": x})
    conv = conv_ref(x[0], wt, bias, (1, 1), (0, 0, 0, 0))
    pool = pool_ref(conv, "MAX", (2, 2), (2, 2), (0, 0, 0, 0))
    assert got.shape == (1, 5, 1, 1) and list(m.inputs[0].shape) == [1, 3, 6, 6]
    close(got.reshape(5), w2 @ pool.reshape(-1))


def test_crop(rng, tmp_path):
    x, ref = rand(rng, 2, 6, 7), rand(rng, 2, 3, 4)
    b = builder([("x", (2, 6, 7)), ("r", (2, 3, 4))], [("a", None), ("b", None)])
    b.add_crop("crop1", left=1, right=2, top=2, bottom=1, offset=[0, 0], input_names=["x"],
               output_name="a")
    b.add_crop("crop2", 0, 0, 0, 0, offset=[1, 2], input_names=["x", "r"], output_name="b")
    _, (c1, c2) = run(b, tmp_path, {"x": x, "r": ref})
    close(c1, x[:, 2:5, 1:5])
    close(c2, x[:, 1:4, 2:6])


@pytest.mark.parametrize("across,norm_var", [(True, True), (True, False)])
def test_mvn_variants(rng, tmp_path, across, norm_var):
    x = rand(rng, 3, 4, 5)
    b = builder([("x", (3, 4, 5))])
    b.add_mvn("mvn", "x", "y", across_channels=across, normalize_variance=norm_var, epsilon=1e-4)
    v = x.astype(np.float64)
    y = v - v.mean()
    close(run1(b, tmp_path, x), y / np.sqrt(v.var() + 1e-4) if norm_var else y)


ND_UNARY = {
    "ceil": np.ceil, "floor": np.floor, "round": np.round, "sign": np.sign, "sin": np.sin,
    "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh, "asinh": np.arcsinh,
    "acosh": lambda v: np.arccosh(np.abs(v) + 1), "atanh": np.arctanh, "exp2": np.exp2,
    "erf": np.vectorize(math.erf), "copy": lambda v: v,
}


@pytest.mark.parametrize("name", sorted(ND_UNARY))
def test_nd_unary(rng, tmp_path, name):
    x = rng.uniform(-0.9, 0.9, (2, 3, 4)).astype(F32)
    b = builder([("x", (2, 3, 4))], exact=True)
    if name == "acosh":
        b.add_unary("shift", "x", "x1", "abs", shift=0, scale=1)
        b.add_elementwise("one", ["x1"], "x2", "ADD", alpha=1.0)
        b.add_acosh("acosh", "x2", "y")
    else:
        getattr(b, "add_" + name)(name, "x", "y")
    close(run1(b, tmp_path, x), ND_UNARY[name](x.astype(np.float64)))


@pytest.mark.parametrize("name", ["max", "min", "pow"])
def test_nd_broadcast_max_min_pow(rng, tmp_path, name):
    a = (np.abs(rand(rng, 2, 3, 4)) + 0.5).astype(F32)
    c = rand(rng, 3, 1)
    b = builder([("a", (2, 3, 4)), ("c", (3, 1))], exact=True)
    getattr(b, f"add_{name}_broadcastable")(name, ["a", "c"], "y")
    f = {"max": np.maximum, "min": np.minimum, "pow": np.power}[name]
    _, (got,) = run(b, tmp_path, {"a": a, "c": c})
    close(got, f(a.astype(np.float64), c))


@pytest.mark.parametrize("name", ["max", "min", "prod", "l1", "l2", "sumsquare", "logsum",
                                  "logsumexp"])
def test_nd_reductions(rng, tmp_path, name):
    x = (rng.uniform(0.5, 1.5, (2, 3, 4))).astype(F32)
    b = builder([("x", (2, 3, 4))], exact=True)
    getattr(b, f"add_reduce_{name}")(name, "x", "y", axes=[1], keepdims=True)
    v = x.astype(np.float64)
    want = {"max": lambda: v.max(1, keepdims=True), "min": lambda: v.min(1, keepdims=True),
            "prod": lambda: v.prod(1, keepdims=True),
            "l1": lambda: np.abs(v).sum(1, keepdims=True),
            "l2": lambda: np.sqrt((v * v).sum(1, keepdims=True)),
            "sumsquare": lambda: (v * v).sum(1, keepdims=True),
            "logsum": lambda: np.log(v.sum(1, keepdims=True)),
            "logsumexp": lambda: np.log(np.exp(v).sum(1, keepdims=True))}[name]()
    close(run1(b, tmp_path, x), want)


def test_reduce_log_sum_axes_and_all(rng, tmp_path):
    x = rng.uniform(0.2, 2.0, (3, 4, 5)).astype(F32)
    b = builder([("x", (3, 4, 5))], [("ax", None), ("all", None)], exact=True)
    b.add_reduce_logsum("ax", "x", "ax", axes=[0, -1], keepdims=False)
    b.add_reduce_logsum("all", "x", "all", keepdims=True, reduce_all=True)
    m, (ax, whole) = run(b, tmp_path, {"x": x})
    assert m.op_histogram == {"reduceLogSum": 2}
    assert ax.shape == (4,) and whole.shape == (1, 1, 1)
    v = x.astype(np.float64)
    close(ax, np.log(v.sum((0, 2))))
    close(whole, np.log(v.sum(keepdims=True)))


def test_rank_preserving_reshape(rng, tmp_path):
    x = rand(rng, 2, 3, 4)
    b = builder([("x", (2, 3, 4))], [("a", None), ("b", None)], exact=True)
    # 0 keeps the input's dim, -1 is inferred
    b.add_rank_preserving_reshape("a", "x", "a", output_shape=(0, -1, 2))
    b.add_rank_preserving_reshape("b", "x", "b", output_shape=(4, 0, -1))
    m, (a, c) = run(b, tmp_path, {"x": x})
    assert m.op_histogram == {"rankPreservingReshape": 2}
    close(a, x.reshape(2, 6, 2))
    close(c, x.reshape(4, 3, 2))
    # a target of another rank fails naming the layer
    b = builder([("x", (2, 3, 4))], exact=True)
    b.add_rank_preserving_reshape("bad", "x", "y", output_shape=(6, 4))
    with pytest.raises(kiln.ValueError, match="layer 'bad' \\(rankPreservingReshape\\)"):
        run(b, tmp_path, {"x": x})
