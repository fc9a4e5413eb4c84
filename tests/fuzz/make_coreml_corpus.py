#!/usr/bin/env python3
"""Writes the Core ML fuzz seed corpus (fuzz_coreml_import): small ML Programs made with
coremltools' MIL builder (elementwise ops over weights in the weight file, linear, conv and
pooling, reshapes and gathers, an fp16 program, palettized and quantized weights), each as one
input (a 4-byte little-endian length, the specification's bytes, the weight file's bytes), and
truncated and bit-flipped variants of each. Deterministic (fixed seed) up to coremltools'
output. Usage: make_coreml_corpus.py OUT_DIR"""
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

    yield "dense", dense, None
    yield "conv", conv, None
    yield "shapes", shapes, None
    yield "half", half, None
    yield "palettized", dense, cto.OptimizationConfig(
        global_config=cto.OpPalettizerConfig(mode="kmeans", nbits=4, weight_threshold=10))
    yield "quantized", dense, cto.OptimizationConfig(
        global_config=cto.OpLinearQuantizerConfig(mode="linear_symmetric", weight_threshold=10))


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
    for name, prog, config in programs(rng):
        with tempfile.TemporaryDirectory() as tmp:
            b = seed_bytes(prog, config, tmp)
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
