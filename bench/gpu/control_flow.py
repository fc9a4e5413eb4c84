#!/usr/bin/env python3
"""A loop of 1,000 iterations of a tiny body (x = x * 0.999 + 0.001 over 256 floats, and the
counter) on one GPU, per iteration, in one process:

  kiln while_loop   the condition (i < n) is computed on the device each iteration
  kiln for_loop     the trip count n is read once
  torch eager       a Python while loop whose condition is a device tensor read with .item()
                    (the data-dependent form), and a Python for loop over a known count
  torch graph       the 1,000 iterations of the known count recorded in one CUDA graph and
                    replayed (torch.cuda.CUDAGraph): the fastest a fixed count can go
  torch.compile     torch._higher_order_ops.while_loop under torch.compile, where this PyTorch
                    build compiles it
  ONNX Runtime      the same loop as an ONNX Loop on the CPU, and kiln's import of that model

The body moves 2 KiB: its own time on the device is a kernel launch, so every figure is the cost
of driving the loop. On a GPU kiln records the loop into its run's CUDA graph as a conditional
node (the condition set on the device each iteration; several loop steps per launch of its body
by default, one with KILN_LOOP_UNROLL=1) and replays it from the second run; with
capture off it drives the loop from the host (one wait for the stream per body run and per
condition read). The goal for a condition on the device is <= 2 us an iteration.

    control_flow.py [--iters 1000] [--reps 5] [--device cuda]
"""
import argparse
import os
import time

import numpy as np

SIZE = 256


def best_us(fn, reps, iters):
    fn()  # first run (compiles, plans) left out
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best / iters * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    import torch

    import kiln

    dev = a.device
    kdev = dev + ":0" if dev == "cuda" else dev
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    n = a.iters
    x0 = np.random.default_rng(0).standard_normal(SIZE).astype(np.float32)
    want = x0.astype(np.float64)
    for _ in range(n):
        want = want * np.float32(0.999) + np.float32(0.001)

    rows = []

    # kiln while_loop: condition on the device
    g = kiln.Graph()
    x = g.placeholder([SIZE], kiln.f32, "x")
    i0 = g.placeholder([], kiln.i64, "i0")
    limit = g.placeholder([], kiln.i64, "n")
    _, xw = kiln.while_loop([i0, x], lambda i, x: i < limit, lambda i, x: [i + 1, x * 0.999 + 0.001])
    feeds = {x: kiln.Array(x0).to(kdev), i0: kiln.Array(np.array(0, np.int64)).to(kdev),
             limit: kiln.Array(np.array(n, np.int64)).to(kdev)}
    # kiln for_loop: trip count fed
    g2 = kiln.Graph()
    x2 = g2.placeholder([SIZE], kiln.f32, "x")
    n2 = g2.placeholder([], kiln.i64, "n")
    (xf,) = kiln.for_loop(n2, [x2], lambda i, x: x * 0.999 + 0.001)
    feeds2 = {x2: kiln.Array(x0).to(kdev), n2: kiln.Array(np.array(n, np.int64)).to(kdev)}
    # recorded (on a GPU: one CUDA graph whose conditional node loops on the device; by default
    # several loop steps per launch of the node's body, KILN_LOOP_UNROLL=1 one), then driven from
    # the host (capture off: one wait per body run and per condition read)
    for capture, unroll, how in ((True, "", "on the device"),
                                 (True, "1", "on the device, one step per launch"),
                                 (False, "", "host-driven")):
        if not dev.startswith("cuda") and capture:
            continue
        # (read by the library when a run is recorded: its first run)
        os.environ["KILN_LOOP_UNROLL"] = unroll
        opts = kiln.CompileOptions(capture=capture)
        ew = g.compile([xw], device=kdev, options=opts)
        np.testing.assert_allclose(ew.run(feeds)[0].numpy(), want, rtol=1e-3, atol=1e-3)
        rows.append((f"kiln while_loop ({how})", best_us(lambda: ew.run(feeds), a.reps, n)))
        ef = g2.compile([xf], device=kdev, options=opts)
        np.testing.assert_allclose(ef.run(feeds2)[0].numpy(), want, rtol=1e-3, atol=1e-3)
        rows.append((f"kiln for_loop ({how})", best_us(lambda: ef.run(feeds2), a.reps, n)))
        if capture:
            print(f"kiln while_loop: {ew.capture_status}, {ew.replayed_runs} runs replayed")
    os.environ.pop("KILN_LOOP_UNROLL", None)

    # PyTorch eager
    tx = torch.tensor(x0, device=dev)
    tn = torch.tensor(n, device=dev)

    def torch_while():
        y, i = tx.clone(), torch.zeros((), dtype=torch.int64, device=dev)
        while (i < tn).item():
            y = y * 0.999 + 0.001
            i = i + 1
        sync()
        return y

    np.testing.assert_allclose(torch_while().cpu().numpy(), want, rtol=1e-3, atol=1e-3)
    rows.append(("torch eager while (.item() per iteration)", best_us(torch_while, a.reps, n)))

    def torch_for():
        y = tx.clone()
        for _ in range(n):
            y = y * 0.999 + 0.001
        sync()
        return y

    rows.append(("torch eager for (count on the host)", best_us(torch_for, a.reps, n)))

    if dev.startswith("cuda"):
        static = tx.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                y = static * 0.999 + 0.001
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = static
            for _ in range(n):
                y = y * 0.999 + 0.001
        out = y

        def replay():
            graph.replay()
            sync()
            return out

        np.testing.assert_allclose(replay().cpu().numpy(), want, rtol=1e-3, atol=1e-3)
        rows.append(("torch CUDA graph of the fixed count", best_us(replay, a.reps, n)))

    try:
        from torch._higher_order_ops.while_loop import while_loop as torch_while_loop

        def body_fn(i, y):
            return i + 1, y * 0.999 + 0.001

        def cond_fn(i, y):
            return i < tn

        compiled = torch.compile(lambda i, y: torch_while_loop(cond_fn, body_fn, (i, y)),
                                 fullgraph=True)

        def run_compiled():
            r = compiled(torch.zeros((), dtype=torch.int64, device=dev), tx.clone())
            sync()
            return r[1]

        np.testing.assert_allclose(run_compiled().cpu().numpy(), want, rtol=1e-3, atol=1e-3)
        rows.append(("torch.compile while_loop", best_us(run_compiled, a.reps, n)))
    except Exception as e:  # noqa: BLE001 (reported, not hidden)
        print(f"torch.compile while_loop: not measured ({type(e).__name__}: {str(e)[:160]})")

    onnx_loop_rows(rows, a, n, x0, want, kdev, dev)

    best_peer = min(us for name, us in rows if not name.startswith("kiln"))
    print(f"{'loop of ' + str(n) + ' iterations':45s} {'us/iter':>9s} {'vs best peer':>14s}")
    for name, us in rows:
        print(f"{name:45s} {us:9.2f} {us / best_peer:13.2f}x")
    print(f"goal (condition on the device): <= 2 us/iter; kiln while_loop is "
          f"{rows[0][1]:.2f} us/iter ({rows[0][0]})")


def onnx_loop_model(n):
    """An ONNX Loop (opset 17) running the body n times: trip count M fed, condition kept true."""
    from onnx import TensorProto, helper

    f32 = TensorProto.FLOAT
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Mul", ["x_in", "a"], ["t"]),
         helper.make_node("Add", ["t", "b"], ["x_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_in", f32, [SIZE])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_out", f32, [SIZE])],
        [helper.make_tensor("a", f32, [], [0.999]), helper.make_tensor("b", f32, [], [0.001])])
    loop = helper.make_node("Loop", ["M", "cond", "x"], ["y"], body=body)
    graph = helper.make_graph(
        [loop], "loop",
        [helper.make_tensor_value_info("M", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", f32, [SIZE])],
        [helper.make_tensor_value_info("y", f32, [SIZE])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def onnx_loop_rows(rows, a, n, x0, want, kdev, dev):
    """The same loop as an ONNX Loop: ONNX Runtime on the CPU (its peer there), and kiln's import
    of it (a while_loop)."""
    try:
        import onnxruntime as ort
    except ImportError as e:
        print(f"ONNX Runtime: not measured ({e})")
        return
    import numpy as np

    import kiln

    model = onnx_loop_model(n)
    feeds = {"M": np.array(n, np.int64), "cond": np.array(True), "x": x0}
    if dev == "cpu":
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(__import__("os").environ.get("KILN_THREADS", "2"))
        sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=1e-3, atol=1e-3)
        rows.append(("ONNX Runtime Loop (CPU)", best_us(lambda: sess.run(None, feeds), a.reps, n)))
    exe = kiln.onnx.load_bytes(model).compile(device=kdev)
    kfeeds = {k: kiln.Array(v).to(kdev) for k, v in feeds.items()}
    np.testing.assert_allclose(exe.run(kfeeds)[0].numpy(), want, rtol=1e-3, atol=1e-3)
    rows.append(("kiln ONNX Loop import (while_loop)", best_us(lambda: exe.run(kfeeds), a.reps, n)))


if __name__ == "__main__":
    main()
