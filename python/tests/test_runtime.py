"""Executables, queues, events, asynchronous runs and packages through the bindings."""
import threading

import numpy as np
import pytest

import kiln
from conftest import cuda_available


def small_model(rng):
    g = kiln.Graph()
    x = g.placeholder([-1, 4], kiln.f32, "x")
    w = g.variable(rng.standard_normal((3, 4)).astype(np.float32), "w")
    y = kiln.relu(kiln.linear(x, w))
    return g, x, w, y


def test_compile_and_inspect(rng):
    g, x, w, y = small_model(rng)
    opts = kiln.CompileOptions(optimize=True, plan_memory=False, num_threads=1)
    assert not opts.plan_memory and opts.in_place and opts.capture and opts.fuse_elementwise
    opts.strict_placement = True
    opts.autocast = None
    exe = g.compile([y], feed_shapes={x: (5, 4)}, device="cpu", options=opts)
    assert exe.device == kiln.cpu and exe.num_steps >= 1 and exe.peak_intermediate_bytes >= 0
    assert [(i.name, tuple(i.shape), i.dtype) for i in exe.inputs()] == [("x", (5, 4), kiln.f32)]
    assert exe.outputs()[0].shape == [5, 3] and "IoInfo" in repr(exe.inputs()[0])
    steps = exe.placement()
    assert steps and all(s.backend == "cpu" and s.fallback_reason == "" for s in steps)
    assert steps[0].op and steps[0].node >= 0
    assert "cpu" in exe.report() and exe.dump()
    assert exe.replayed_runs == 0 and isinstance(exe.capture_status, str)
    xv = rng.standard_normal((5, 4)).astype(np.float32)
    # float64 reference; f32 sums of four products: a few units in the last place of the terms
    want = np.maximum(xv.astype(np.float64) @ g.read_variable(w).numpy().T, 0)
    np.testing.assert_allclose(exe.run({x: xv})[0].numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(exe.run({"x": xv})[0].numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(exe({x: kiln.Array(xv)})[0].numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(exe.run({x: kiln.from_dlpack(xv)})[0].numpy(), want, rtol=1e-5,
                               atol=1e-6)
    # TF32 is a CUDA math mode: off by default, and the CPU computes the same bits with it
    assert not opts.allow_tf32 and kiln.CompileOptions(allow_tf32=True).allow_tf32
    opts.allow_tf32 = True
    tf32 = g.compile([y], feed_shapes={x: (5, 4)}, device="cpu", options=opts)
    np.testing.assert_array_equal(tf32.run({x: xv})[0].numpy(), exe.run({x: xv})[0].numpy())
    with pytest.raises(kiln.ShapeError, match="placeholder 'x'"):
        exe.run({x: np.zeros((6, 4), np.float32)})
    with pytest.raises(kiln.DTypeError):
        exe.run({x: np.zeros((5, 4), np.float64)})
    assert exe.variable_names() == ["w"]
    exe.write_variable("w", np.ones((3, 4), np.float32))
    np.testing.assert_array_equal(exe.read_variable("w").numpy(), np.ones((3, 4)))


def test_kernel_choices(rng):
    # the defaults of include/kiln/kernel_choices.h, and fields that keep what is set
    k = kiln.CompileOptions().kernels
    assert k.channels_last and k.cudnn_graph and k.qconv_implicit_gemm and k.attention_f32_tiles
    assert k.rnn_persistent_forward and not k.rnn_persistent_backward and not k.programmatic_launch
    opts = kiln.CompileOptions()
    opts.kernels.channels_last = False
    opts.kernels.programmatic_launch = True
    assert not opts.kernels.channels_last and opts.kernels.programmatic_launch
    choices = kiln.KernelChoices()
    choices.cudnn_graph = False
    opts.kernels = choices
    assert not opts.kernels.cudnn_graph and opts.kernels.channels_last
    assert not opts.deterministic and opts.fuse_quant
    g, x, w, y = small_model(rng)
    xv = rng.standard_normal((5, 4)).astype(np.float32)
    got = g.compile([y], feed_shapes={x: (5, 4)}, device="cpu", options=opts).run({x: xv})[0]
    want = np.maximum(xv.astype(np.float64) @ g.read_variable(w).numpy().T, 0)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


def test_packages_round_trip(rng, tmp_path):
    g, x, w, y = small_model(rng)
    exe = g.compile([y], feed_shapes={x: (2, 4)}, device="cpu")
    path = str(tmp_path / "m.kiln")
    exe.save(path, producer="pytest", source_hash="abc", output_names=["probs"])
    xv = rng.standard_normal((2, 4)).astype(np.float32)
    want = exe.run({x: xv})[0].numpy()
    loaded = kiln.Executable.load(path, "cpu")
    info = loaded.package_info
    assert info.producer == "pytest" and info.source_hash == "abc" and info.compiled_for == "cpu"
    assert info.path == path and info.kiln_version == kiln.__version__ and info.format_version >= 1
    assert not info.replanned and loaded.outputs()[0].name == "probs"
    np.testing.assert_array_equal(loaded.run({"x": xv})[0].numpy(), want)
    with open(path, "rb") as f:
        data = f.read()
    np.testing.assert_array_equal(kiln.Executable.load_bytes(data, "cpu").run({"x": xv})[0].numpy(), want)
    np.testing.assert_array_equal(kiln.load(path, "cpu").run({"x": xv})[0].numpy(), want)
    with pytest.raises(kiln.FormatError):
        kiln.Executable.load_bytes(data[:100], "cpu")
    with pytest.raises(kiln.IoError):
        kiln.Executable.load(str(tmp_path / "missing.kiln"), "cpu", verify_weights=True, strict=False)


def test_packages_store_the_cpus_laid_out_weights(rng, tmp_path):
    """A package saved after a run holds the weight the CPU laid out for oneDNN; a load on this CPU
    takes it, and the results are those of the executable that saved it, bit for bit."""
    g = kiln.Graph()
    x = g.placeholder([64, 512], kiln.f32, "x")
    wv = (rng.standard_normal((256, 512)) * 0.05).astype(np.float32)
    y = kiln.relu(kiln.linear(x, g.constant(wv)))
    exe = g.compile([y], device="cpu")
    xv = rng.standard_normal((64, 512)).astype(np.float32)
    want = exe.run({x: xv})[0].numpy()
    path = str(tmp_path / "laid_out.kiln")
    exe.save(path, laid_out_weights=True)
    info = kiln.Executable.load(path, "cpu").package_info
    assert info.laid_out_weights == 1 and info.laid_out_taken == 1 and info.laid_out_for.startswith("onednn "), (
        info.laid_out_weights, info.laid_out_taken, info.laid_out_for)
    np.testing.assert_array_equal(kiln.Executable.load(path, "cpu").run({"x": xv})[0].numpy(), want)
    np.testing.assert_allclose(want, np.maximum(xv.astype(np.float64) @ wv.T.astype(np.float64), 0), rtol=1e-4,
                               atol=1e-5)
    # by default, or never run before saving: none stored
    for i, e in enumerate([exe, g.compile([y], device="cpu")]):
        path2 = str(tmp_path / f"plain{i}.kiln")
        e.save(path2, laid_out_weights=i == 1)
        plain = kiln.Executable.load(path2, "cpu").package_info
        assert plain.laid_out_weights == 0 and plain.laid_out_taken == 0 and plain.laid_out_for == ""


def test_run_async_queues_events_and_futures(rng):
    g = kiln.Graph()
    x = g.placeholder([3], kiln.f32, "x")
    exe = g.compile([x * 2], device="cpu")
    q1, q2 = kiln.Queue("cpu"), kiln.Queue(kiln.cpu)
    assert q1.device == kiln.cpu and q1.native_handle == 0
    ev = kiln.Event()
    assert ev.value == 0 and ev == ev
    xv = rng.standard_normal(3).astype(np.float32)
    # the second run waits for the event that the host signals later
    f2 = exe.run_async(q2, {x: xv}, wait_events=[(ev, 1)], signal_events=[(ev, 2, kiln.Stage.completed)])
    assert not f2.done()
    assert not ev.wait(2, timeout=0.05)
    ev.signal(1)
    np.testing.assert_allclose(f2.result(timeout=30)[0].numpy(), xv * 2)
    assert ev.wait(2, timeout=30) and ev.value == 2
    f1 = exe.run_async(q1, {"x": xv}, signal_events=[(ev, 3, kiln.Stage.scheduled)])
    np.testing.assert_allclose(f1.result()[0].numpy(), xv * 2)
    ev.wait(3)
    # host work on a queue runs in order, on a kiln thread, with the GIL
    seen = []
    q1.submit(lambda: seen.append(threading.current_thread() is not threading.main_thread()))
    q1.wait()
    assert seen == [True]
    # notify calls back once the value is reached
    done = threading.Event()
    got = []
    ev.notify(4, lambda err: (got.append(err), done.set()))
    ev.signal(4)
    assert done.wait(30) and got == [None]
    # a failing run reports its error through the future
    bad = g.compile([kiln.gather(x, g.placeholder([1], kiln.i64, "i"))], device="cpu")
    fut = bad.run_async(q1, {x: xv, "i": np.array([7])})
    with pytest.raises(kiln.ValueError):
        fut.result()


@pytest.mark.skipif(not cuda_available(), reason="no CUDA device")
def test_cuda_executable(rng):
    g, x, w, y = small_model(rng)
    exe = g.compile([y], feed_shapes={x: (5, 4)}, device="cuda:0")
    xv = rng.standard_normal((5, 4)).astype(np.float32)
    out = exe.run({x: xv})[0]
    assert out.device == kiln.cuda(0)
    want = np.maximum(xv @ g.read_variable(w).numpy().T, 0)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)
    q = kiln.Queue("cuda:0")
    assert q.native_handle != 0
    np.testing.assert_allclose(exe.run_async(q, {x: xv}).result()[0].numpy(), want, rtol=1e-5, atol=1e-6)


def test_result_types(rng, tmp_path):
    g, x, w, y = small_model(rng)
    assert isinstance(y, kiln.Tensor) and isinstance(y.dtype, kiln.DType)
    exe = g.compile([y], feed_shapes={x: (1, 4)}, device="cpu")
    assert all(isinstance(s, kiln.StepInfo) for s in exe.placement())
    fut = exe.run_async(kiln.Queue(), {x: np.ones((1, 4), np.float32)})
    assert isinstance(fut, kiln.Future)
    fut.result()
    exe.save(str(tmp_path / "p.kiln"))
    assert isinstance(kiln.load(str(tmp_path / "p.kiln"), "cpu").package_info, kiln.PackageInfo)
    assert exe.package_info is None
    h = g.placeholder([2, 3], kiln.f32)
    r = kiln.lstm(kiln.expand_dims(h, [0]), [kiln.RnnLayerWeights(g.constant(np.ones((1, 8, 3), np.float32)),
                                                                   g.constant(np.ones((1, 8, 2), np.float32)))])
    assert isinstance(r, kiln.RnnResult)
    idx = g.constant(np.zeros((2, 3), np.int64))
    s = kiln.scatter_elements(h, idx, h, 0, kiln.ScatterReduction.add)
    out = g.compile([s], device="cpu").run({h: np.ones((2, 3), np.float32)})[0].numpy()
    np.testing.assert_array_equal(out, [[3, 3, 3], [1, 1, 1]])
    for red in (kiln.ScatterReduction.mul, kiln.ScatterReduction.max, kiln.ScatterReduction.min,
                kiln.ScatterReduction.none):
        assert red.name


def test_numpy_feeds_are_read_in_place(rng):
    """C-contiguous numpy feeds of every dtype kiln has are read where they are, yet the results
    are those of copies: a returned feed is a copy, and changing a feed after the run changes no
    output. Views, Fortran order and big-endian arrays are converted first."""
    for dt, kt in [(np.float32, kiln.f32), (np.float64, kiln.f64), (np.float16, kiln.f16),
                   (np.int8, kiln.i8), (np.int16, kiln.i16), (np.int32, kiln.i32),
                   (np.int64, kiln.i64), (np.uint8, kiln.u8), (np.bool_, kiln.boolean)]:
        g = kiln.Graph()
        x = g.placeholder([3, 5], kt, "x")
        y = kiln.reshape(x, [5, 3])
        exe = g.compile([x, y], device="cpu")
        v = (rng.standard_normal((3, 5)) * 10).astype(dt)
        want = v.copy()
        same, reshaped = [o.numpy() for o in exe.run({"x": v})]
        np.testing.assert_array_equal(same, want)
        np.testing.assert_array_equal(reshaped, want.reshape(5, 3))
        out = exe.run({x: v})[0]
        v[...] = v[::-1]  # the caller reuses its buffer
        np.testing.assert_array_equal(out.numpy(), want)
    g = kiln.Graph()
    x = g.placeholder([4, 3], kiln.f32, "x")
    exe = g.compile([x * 2.0], device="cpu")
    base = rng.standard_normal((8, 6)).astype(np.float32)
    for v in [base[::2, ::2], np.asfortranarray(base[:4, :3]), base[:4, :3].astype(">f4"),
              base[1:5, 1:4]]:
        np.testing.assert_allclose(exe.run({"x": v})[0].numpy(), np.asarray(v, np.float32) * 2)
