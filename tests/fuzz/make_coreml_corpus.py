#!/usr/bin/env python3
"""Writes the Core ML fuzz seed corpus (fuzz_coreml_import): small ML Programs made with
coremltools' MIL builder (elementwise ops over weights in the weight file, linear, conv and
pooling, reshapes and gathers, an fp16 program, palettized and quantized weights, a while_loop
and a cond) and NeuralNetwork models made with its NeuralNetworkBuilder (a convnet with image
preprocessing, ND layers), each as one input (a 4-byte little-endian length, the
specification's bytes, the weight file's bytes), and truncated and bit-flipped variants of each.
Deterministic (fixed seed) up to coremltools' output. Usage: make_coreml_corpus.py OUT_DIR"""
import os
import random
import struct
import sys
import tempfile
import warnings

import numpy as np

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import coremltools as ct
    import coremltools.optimize.coreml as cto
    from coremltools.converters.mil import Builder as mb


def programs(rng):
    w = rng.standard_normal((16, 8)).astype(np.float32)
    k = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)

    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 8))], opset_version=ct.target.iOS16)
    def dense(x):
        return mb.softmax(x=mb.relu(x=mb.linear(x=x, weight=w, bias=np.ones(16, np.float32))),
                          axis=-1)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 3, 8, 8))], opset_version=ct.target.iOS16)
    def conv(x):
        y = mb.conv(x=x, weight=k, pad_type="same", strides=[1, 1])
        y = mb.max_pool(x=y, kernel_sizes=[2, 2], strides=[2, 2], pad_type="valid")
        return mb.reduce_mean(x=y, axes=[2, 3], keep_dims=False)

    @mb.program(input_specs=[mb.TensorSpec(shape=(4, 6)),
                             mb.TensorSpec(shape=(3,), dtype=ct.converters.mil.mil.types.int32)],
                opset_version=ct.target.iOS16)
    def shapes(x, i):
        y = mb.reshape(x=x, shape=[2, 12])
        z = mb.transpose(x=mb.reshape(x=y, shape=[6, 4]), perm=[1, 0])
        return mb.gather(x=z, indices=i, axis=0), mb.concat(values=[x, x], axis=0)

    @mb.program(input_specs=[mb.TensorSpec(shape=(3, 8), dtype=ct.converters.mil.mil.types.fp16)],
                opset_version=ct.target.iOS16)
    def half(x):
        return mb.tanh(x=mb.mul(x=x, y=w[:3].astype(np.float16)))

    @mb.program(input_specs=[mb.TensorSpec(shape=(3,)), mb.TensorSpec(shape=(1,))],
                opset_version=ct.target.iOS16)
    def control(x, n):
        i0 = mb.const(val=np.array([0.0], np.float32))
        _, y = mb.while_loop(_cond=lambda i, v: mb.less(x=i, y=n),
                             _body=lambda i, v: (mb.add(x=i, y=1.0), mb.mul(x=v, y=0.5)),
                             loop_vars=(i0, x))
        p = mb.greater(x=mb.reduce_sum(x=y, axes=[0]), y=0.0)
        return mb.cond(pred=p, _true_fn=lambda: mb.relu(x=y), _false_fn=lambda: mb.neg(x=y)
                       if hasattr(mb, "neg") else mb.mul(x=y, y=-1.0))

    yield "dense", dense, None
    yield "control", control, None
    yield "conv", conv, None
    yield "shapes", shapes, None
    yield "half", half, None
    yield "palettized", dense, cto.OptimizationConfig(
        global_config=cto.OpPalettizerConfig(mode="kmeans", nbits=4, weight_threshold=10))
    yield "quantized", dense, cto.OptimizationConfig(
        global_config=cto.OpLinearQuantizerConfig(mode="linear_symmetric", weight_threshold=10))


def neural_networks(rng):
    """NeuralNetwork specifications: a convnet over an image input with scale and bias, and a
    network of ND layers."""
    from coremltools.models import datatypes
    from coremltools.models.neural_network import NeuralNetworkBuilder

    b = NeuralNetworkBuilder([("image", datatypes.Array(3, 8, 8))], [("y", None)])
    b.add_convolution("conv", 3, 4, 3, 3, 1, 1, "same", 1,
                      rng.standard_normal((3, 3, 3, 4)).astype(np.float32),
                      np.zeros(4, np.float32), True, input_name="image", output_name="c")
    b.add_activation("relu", "RELU", "c", "r")
    b.add_pooling("pool", 2, 2, 2, 2, "MAX", "VALID", "r", "p")
    b.add_flatten("flat", 0, "p", "f")
    b.add_inner_product("ip", rng.standard_normal((5, 64)).astype(np.float32), None, 64, 5,
                        False, "f", "y")
    b.set_pre_processing_parameters(image_input_names=["image"], image_scale=1 / 255.0,
                                    red_bias=-0.5, green_bias=-0.5, blue_bias=-0.5)
    yield "nn_conv", b.spec
    b = NeuralNetworkBuilder([("x", datatypes.Array(2, 6))], [("y", None)],
                             disable_rank5_shape_mapping=True)
    b.add_load_constant_nd("w", "w", rng.standard_normal((6, 4)).astype(np.float32), (6, 4))
    b.add_batched_mat_mul("mm", ["x", "w"], "m")
    b.add_softmax_nd("sm", "m", "s", axis=-1)
    b.add_reduce_sum("sum", "s", "t", axes=[1], keepdims=True)
    b.add_add_broadcastable("add", ["s", "t"], "y")
    yield "nn_nd", b.spec


def seed_bytes(prog, config, tmp):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS16,
                       compute_precision=ct.precision.FLOAT32,
                       pass_pipeline=ct.PassPipeline.EMPTY)
        if config is not None:
            m = (cto.palettize_weights if "Palettizer" in type(config.global_config).__name__
                 else cto.linear_quantize_weights)(m, config)
    path = os.path.join(tmp, "m.mlpackage")
    m.save(path)
    data = os.path.join(path, "Data", "com.apple.CoreML")
    spec = open(os.path.join(data, "model.mlmodel"), "rb").read()
    weights_file = os.path.join(data, "weights", "weight.bin")
    weights = open(weights_file, "rb").read() if os.path.exists(weights_file) else b""
    return struct.pack("<I", len(spec)) + spec + weights


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    rand = random.Random(0)
    seeds = []
    for name, prog, config in programs(rng):
        with tempfile.TemporaryDirectory() as tmp:
            seeds.append((name, seed_bytes(prog, config, tmp)))
    for name, spec in neural_networks(rng):
        data = spec.SerializeToString()
        seeds.append((name, struct.pack("<I", len(data)) + data))
    for name, b in seeds:
        variants = {"": b, "_cut": b[:len(b) * 2 // 3], "_cut_weights": b[:len(b) - 40]}
        flipped = bytearray(b)
        for _ in range(8):
            i = rand.randrange(4, len(flipped))
            flipped[i] ^= 1 << rand.randrange(8)
        variants["_flip"] = bytes(flipped)
        for suffix, v in variants.items():
            with open(os.path.join(out, f"{name}{suffix}.bin"), "wb") as f:
                f.write(v)


if __name__ == "__main__":
    main()
