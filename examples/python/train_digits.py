"""kiln from Python, end to end: build a graph, train it, save a package, load it, infer.

A small MLP learns scikit-learn's 8x8 handwritten digits. Run:

    PYTHONPATH=build/python python examples/python/train_digits.py [--out DIR] [--device cpu]
"""
import argparse
import os
import tempfile

import numpy as np
from sklearn.datasets import load_digits

import kiln


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=tempfile.mkdtemp(prefix="kiln-digits-"))
    ap.add_argument("--device", default=str(kiln.default_device()))
    ap.add_argument("--epochs", type=int, default=30)
    args = ap.parse_args()
    device = kiln.Device(args.device)

    digits = load_digits()
    x_all = (digits.data / 16.0).astype(np.float32)
    y_all = digits.target.astype(np.int64)
    perm = np.random.default_rng(0).permutation(len(x_all))
    train, test = perm[:1500], perm[1500:]
    batch = 50

    # build: a two-layer MLP with variables, its loss, gradients and an Adam step
    rng = np.random.default_rng(1)
    g = kiln.Graph()
    x = g.placeholder([None, 64], kiln.f32, "x")
    labels = g.placeholder([None], kiln.i64, "labels")
    w1 = g.variable((rng.standard_normal((64, 64)) * np.sqrt(2 / 64)).astype(np.float32), "w1")
    b1 = g.variable(np.zeros(64, np.float32), "b1")
    w2 = g.variable((rng.standard_normal((10, 64)) * np.sqrt(1 / 64)).astype(np.float32), "w2")
    b2 = g.variable(np.zeros(10, np.float32), "b2")
    logits = kiln.linear(kiln.relu(kiln.linear(x, w1, b1)), w2, b2)
    probs = kiln.softmax(logits)
    loss = kiln.softmax_cross_entropy(logits, labels)
    params = [w1, b1, w2, b2]
    step = kiln.optim.adam(g, params, kiln.gradients(loss, params), lr=1e-2)

    # train
    train_exe = g.compile([loss], feed_shapes={x: (batch, 64), labels: (batch,)}, updates=step,
                          device=device)
    order = np.random.default_rng(2)
    for epoch in range(args.epochs):
        idx = order.permutation(train)
        for i in range(0, len(idx) - batch + 1, batch):
            rows = idx[i:i + batch]
            (l,) = train_exe.run({x: x_all[rows], labels: y_all[rows]})
    print(f"final training loss {l.item():.4f}")

    # save: the inference executable as a package (variables' current values included)
    infer = g.compile([probs], feed_shapes={x: (len(test), 64)}, device=device)
    path = os.path.join(args.out, "digits.kiln")
    infer.save(path, producer="examples/python/train_digits.py", output_names=["probs"])
    g.save_variables(os.path.join(args.out, "digits.ckpt"))

    # load and infer: no graph, no compile
    loaded = kiln.Executable.load(path, device)
    (p,) = loaded.run({"x": x_all[test]})
    accuracy = float((p.numpy().argmax(1) == y_all[test]).mean())
    print(f"test accuracy {accuracy:.3f} ({len(test)} digits) from {path}")
    return accuracy


if __name__ == "__main__":
    main()
