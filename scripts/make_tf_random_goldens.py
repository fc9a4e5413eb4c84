#!/usr/bin/env python3
"""Writes tests/data/random/*.npy: TensorFlow's stateless random f32 values for tests/ops/test_random.cpp.

Run under a Python with tensorflow-cpu (from PyPI) and numpy:
    python scripts/make_tf_random_goldens.py [out_dir]
Each file is <op>_<seed0>_<seed1>_<dims>.npy holding
tf.random.stateless_<op>(shape, seed=[seed0, seed1]) with default arguments (float32, the
default algorithm, on the CPU). The tests need no TensorFlow.
"""
import os
import sys

import numpy as np
import tensorflow as tf

CASES = [
    # (seed, shape): odd sizes, sizes not multiple of 4, a larger one
    ((1, 2), (7,)),
    ((0, 0), (4, 4)),
    ((-5, 12345678901), (3, 5, 3)),
    ((42, -1), (1001,)),
    ((2**31 - 1, 7), (2, 2, 2, 3)),
    ((123, 456), (4099,)),
]
OPS = {
    "uniform": tf.random.stateless_uniform,
    "normal": tf.random.stateless_normal,
    "truncated_normal": tf.random.stateless_truncated_normal,
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "..", "tests", "data", "random")
    os.makedirs(out, exist_ok=True)
    with tf.device("/CPU:0"):
        for name, fn in OPS.items():
            for seed, shape in CASES:
                v = fn(shape, seed=tf.constant(seed, tf.int64)).numpy()
                assert v.dtype == np.float32
                dims = "x".join(str(d) for d in shape)
                fname = f"{name}_{seed[0]}_{seed[1]}_{dims}.npy".replace("-", "m")
                np.save(os.path.join(out, fname), v)
    print("wrote", out)


if __name__ == "__main__":
    main()
