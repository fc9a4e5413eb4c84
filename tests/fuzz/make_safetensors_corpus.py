#!/usr/bin/env python3
"""Writes the safetensors fuzz seeds: small valid files (one tensor; several dtypes with
metadata; a bool tensor, a 0-d tensor and an empty one) written byte by byte as the format
defines them, plus truncated and bit-flipped variants. Deterministic (fixed seed).
Usage: make_safetensors_corpus.py OUT_DIR"""
import json
import os
import random
import struct
import sys

import numpy as np


def file_of(tensors, metadata=None):
    header, data, at = {}, b"", 0
    for name, dtype, arr in tensors:
        raw = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [at, at + len(raw)]}
        data += raw
        at += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def seeds():
    rng = np.random.default_rng(0)
    yield "one", file_of([("w", "F32", rng.standard_normal((2, 3)).astype(np.float32))])
    yield "dtypes", file_of([
        ("a", "F64", rng.standard_normal(3)), ("b", "F16", rng.standard_normal(4).astype(np.float16)),
        ("c", "I64", rng.integers(0, 9, 2)), ("d", "I8", rng.integers(-5, 5, 3).astype(np.int8)),
        ("e", "BF16", rng.integers(0, 65535, 2).astype(np.uint16)),
        ("f", "U8", rng.integers(0, 255, 5).astype(np.uint8))], {"format": "pt"})
    yield "bool_scalar_empty", file_of([
        ("m", "BOOL", rng.integers(0, 2, 4).astype(np.bool_)), ("s", "F32", np.float32([1.5]).reshape(())),
        ("z", "F32", np.zeros((0, 3), np.float32))])


def main(out):
    os.makedirs(out, exist_ok=True)
    r = random.Random(0)
    for name, data in seeds():
        with open(os.path.join(out, name + ".safetensors"), "wb") as f:
            f.write(data)
        for k in range(3):
            cut = data[: r.randrange(1, len(data))]
            with open(os.path.join(out, f"{name}_cut{k}.safetensors"), "wb") as f:
                f.write(cut)
            flipped = bytearray(data)
            i = r.randrange(len(flipped))
            flipped[i] ^= 1 << r.randrange(8)
            with open(os.path.join(out, f"{name}_flip{k}.safetensors"), "wb") as f:
                f.write(bytes(flipped))


if __name__ == "__main__":
    main(sys.argv[1])
