#!/usr/bin/env python3
"""A BERT encoder on the CPU over a sweep of calls whose batch and sequence change from call to
call, kiln against ONNX Runtime on the same ONNX file, both with the same number of threads.

The model is written here in ONNX as the PyTorch exporters write BERT (no PyTorch needed): token
and position embeddings (the positions from Range over Shape), an additive attention mask, the
heads split and merged by Reshape to shapes concatenated from Shape, GELU through Erf, layer
norms; batch and sequence are dim_params. Weights are random. kiln imports it once with both dims
dynamic (one dynamic executable: a new shape compiles a specialization on its first call), ONNX
Runtime makes one session. Every call is timed, the first call of each new shape included, and the
import/compile (kiln) and session creation (ONNX Runtime) are added to the totals.

    bench/cpu/bert_dynamic.py [--layers 4] [--hidden 256] [--calls 50] [--threads 2]
        [--max-batch 32] [--max-seq 512] [--python-path build/python]

The sweep's shapes are the GPU sweep's (bench/gpu/bert_dynamic.py): batch 1..max-batch, sequence
16..max-seq, from the same generator.
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from sweep_shapes import sweep_shapes  # noqa: E402  (the GPU sweep's generator)


def bert_onnx(path, layers, hidden, heads, vocab=30522, max_pos=512, seed=0):
    """Writes a BERT encoder (last_hidden_state) with dim_params batch and seq to `path`."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits, nodes = [], []
    head_dim, ff = hidden // heads, 4 * hidden

    def w(name, *shape, scale=0.02):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32),
                                             name))
        return name

    def const(name, values, dtype=np.int64):
        inits.append(numpy_helper.from_array(np.array(values, dtype=dtype), name))
        return name

    def node(op, inputs, name, **attrs):
        nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def linear(x, name, fin, fout):
        y = node("MatMul", [x, w(name + ".w", fin, fout)], name + ".mm")
        return node("Add", [y, w(name + ".b", fout)], name)

    def layer_norm(x, name):
        inits.append(numpy_helper.from_array(np.ones(hidden, np.float32), name + ".g"))
        inits.append(numpy_helper.from_array(np.zeros(hidden, np.float32), name + ".beta"))
        return node("LayerNormalization", [x, name + ".g", name + ".beta"], name, axis=-1,
                    epsilon=1e-12)

    const("zero", 0), const("one", 1), const("i0", [0]), const("i2", [2])
    const("heads_dims", [heads, head_dim]), const("hidden_dim", [hidden])
    const("axes12", [1, 2])
    inits.append(numpy_helper.from_array(np.array(1.0, np.float32), "f1"))
    inits.append(numpy_helper.from_array(np.array(-10000.0, np.float32), "fneg"))
    inits.append(numpy_helper.from_array(np.array(1 / np.sqrt(head_dim), np.float32), "scale"))
    inits.append(numpy_helper.from_array(np.array(1 / np.sqrt(2), np.float32), "rsqrt2"))
    inits.append(numpy_helper.from_array(np.array(0.5, np.float32), "half"))

    shape_ids = node("Shape", ["input_ids"], "shape_ids")
    seq = node("Gather", [shape_ids, "one"], "seq", axis=0)
    pos = node("Range", ["zero", seq, "one"], "positions")
    emb = node("Add", [node("Gather", [w("word_emb", vocab, hidden), "input_ids"], "word"),
                       node("Gather", [w("pos_emb", max_pos, hidden), pos], "pos")], "emb")
    x = layer_norm(emb, "emb_ln")
    m = node("Cast", [node("Unsqueeze", ["attention_mask", "axes12"], "mask4")], "maskf", to=1)
    bias = node("Mul", [node("Sub", ["f1", m], "inv_mask"), "fneg"], "mask_bias")
    for i in range(layers):
        p = f"l{i}"
        shp = node("Shape", [x], p + ".shape")
        bs = node("Slice", [shp, "i0", "i2"], p + ".bs")
        split = node("Concat", [bs, "heads_dims"], p + ".split", axis=0)
        merged = node("Concat", [bs, "hidden_dim"], p + ".merged", axis=0)

        def heads_of(name, perm):
            r = node("Reshape", [linear(x, f"{p}.{name}", hidden, hidden), split], f"{p}.{name}.r")
            return node("Transpose", [r], f"{p}.{name}.t", perm=perm)

        q, k, v = heads_of("q", [0, 2, 1, 3]), heads_of("k", [0, 2, 3, 1]), heads_of("v", [0, 2, 1, 3])
        s = node("Mul", [node("MatMul", [q, k], p + ".qk"), "scale"], p + ".scaled")
        probs = node("Softmax", [node("Add", [s, bias], p + ".masked")], p + ".probs", axis=-1)
        ctx = node("Transpose", [node("MatMul", [probs, v], p + ".ctx")], p + ".ctx.t",
                   perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, merged], p + ".ctx.r")
        x = layer_norm(node("Add", [linear(ctx, p + ".o", hidden, hidden), x], p + ".res1"),
                       p + ".ln1")
        h = linear(x, p + ".ff1", hidden, ff)
        erf = node("Erf", [node("Mul", [h, "rsqrt2"], p + ".hs")], p + ".erf")
        gelu = node("Mul", [node("Mul", [h, "half"], p + ".hh"),
                            node("Add", [erf, "f1"], p + ".erf1")], p + ".gelu")
        x = layer_norm(node("Add", [linear(gelu, p + ".ff2", ff, hidden), x], p + ".res2"),
                       p + ".ln2")
    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"]))
    ins = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
           for n in ("input_ids", "attention_mask")]
    out = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                        ["batch", "seq", hidden])
    graph = helper.make_graph(nodes, "bert", ins, [out], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, path)


def feeds_for(b, s, vocab):
    ids = (np.arange(b * s, dtype=np.int64).reshape(b, s) * 7919) % vocab
    mask = np.ones((b, s), np.int64)
    mask[0, s // 2:] = 0  # one padded sequence
    return {"input_ids": ids, "attention_mask": mask}


def sweep(run, shapes, vocab):
    """Per-call ms of run(feeds) over the sweep."""
    out = []
    for b, s in shapes:
        f = feeds_for(b, s, vocab)
        t0 = time.perf_counter()
        run(f)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--max-seq", type=int, default=512)
    ap.add_argument("--python-path", default=None,
                    help="folder holding the kiln package (default: build/python, build-gpu/python)")
    a = ap.parse_args()
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    for p in ([a.python_path] if a.python_path else
              [os.path.join(root, "build", "python"), os.path.join(root, "build-gpu", "python")]):
        if os.path.isdir(os.path.join(p, "kiln")):
            sys.path.insert(0, p)
            break
    os.environ["KILN_THREADS"] = str(a.threads)
    import kiln
    import onnxruntime as ort

    vocab = 30522
    shapes = sweep_shapes(a.calls, a.max_batch, a.max_seq)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bert.onnx")
        bert_onnx(path, a.layers, a.hidden, a.heads, vocab)
        opts = kiln.CompileOptions()
        opts.max_specializations = 2 * len(shapes)  # every shape of the sweep stays cached
        t0 = time.perf_counter()
        exe = kiln.onnx.load(path).compile(device="cpu", options=opts)
        kiln_setup = (time.perf_counter() - t0) * 1e3
        assert exe.is_dynamic
        t0 = time.perf_counter()
        so = ort.SessionOptions()
        so.intra_op_num_threads = a.threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        ort_setup = (time.perf_counter() - t0) * 1e3

        # the outputs agree at one shape before anything is timed
        f = feeds_for(3, 37, vocab)
        got, want = exe.run(f)[0].numpy(), sess.run(None, f)[0]
        err = float(np.abs(got - want).max())
        assert err < 1e-3, f"kiln and ONNX Runtime differ by {err}"
        exe = kiln.onnx.load(path).compile(device="cpu", options=opts)  # a fresh executable: no shape seen

        kiln_ms = sweep(lambda f: exe.run(f)[0].numpy(), shapes, vocab)
        ort_ms = sweep(lambda f: sess.run(None, f), shapes, vocab)
        # the same sweep again: every shape has been seen (kiln's warm calls)
        kiln_warm = sweep(lambda f: exe.run(f)[0].numpy(), shapes, vocab)
        ort_warm = sweep(lambda f: sess.run(None, f), shapes, vocab)

    seen, firsts = set(), []
    for (shape, ms, warm) in zip(shapes, kiln_ms, kiln_warm):
        if shape not in seen:
            seen.add(shape)
            firsts.append(ms - warm)
    c = exe.shape_cache()
    kt, ot = sum(kiln_ms) + kiln_setup, sum(ort_ms) + ort_setup
    print(f"BERT encoder, {a.layers} layers, hidden {a.hidden}, {a.heads} heads; {len(shapes)} calls "
          f"({len(seen)} shapes), batch 1-{a.max_batch}, sequence 16-{a.max_seq}; "
          f"{a.threads} threads; max |kiln - ORT| {err:.1e}")
    print(f"sweep, every call timed, setup included: kiln {kt / 1e3:.2f} s (import and compile "
          f"{kiln_setup:.0f} ms), ONNX Runtime {ot / 1e3:.2f} s (session {ort_setup:.0f} ms); "
          f"kiln / ORT {kt / ot:.2f}")
    print(f"the sweep again, every shape seen: kiln {sum(kiln_warm) / 1e3:.2f} s, ONNX Runtime "
          f"{sum(ort_warm) / 1e3:.2f} s; kiln / ORT {sum(kiln_warm) / sum(ort_warm):.2f}")
    print(f"first call of a new shape over its warm call: mean {np.mean(firsts):.1f} ms, median "
          f"{np.median(firsts):.1f} ms, max {max(firsts):.1f} ms")
    print(f"shape cache: {c['misses']} misses, {c['hits']} hits, {c['evictions']} evictions, "
          f"peak {c.get('peak_bytes', c['bytes']) / 2**20:.0f} MiB (bound "
          f"{c.get('max_bytes', 0) / 2**20:.0f} MiB)")
    print(f"onnxruntime {ort.__version__}, {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
