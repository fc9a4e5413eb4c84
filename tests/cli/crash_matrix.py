#!/usr/bin/env python3
"""Every kiln command on bad input: missing, empty, truncated, wrong-magic and directory paths,
.npy files with absurd shapes or dtypes, unknown flags, names and devices, feeds of the wrong
dtype or shape. Each case must end with exit status 1 and exactly one line on stderr,
"error: [component] ...", within its timeout: never a signal, a sanitizer report or a hang.
A few cases may also succeed (marked "ok or error"); they must still not crash.

Usage: crash_matrix.py KILN [WORKDIR]. Under ctest the kiln binary is the build's (label unit:
`make test-asan` runs it against the ASan build). The models are made here with the onnx package.
"""
import concurrent.futures
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

TIMEOUT = 120
SANITIZER_MARKS = ("AddressSanitizer", "LeakSanitizer", "runtime error:", "UndefinedBehaviorSanitizer",
                   "ThreadSanitizer", "terminate called", "Segmentation fault", "core dumped")


ASAN_ALLOC_WARNING = re.compile(r"==\d+==WARNING: AddressSanitizer failed to allocate 0x[0-9a-f]+ bytes$")


def npy_header(descr, shape, fortran=False, data=b""):
    h = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, shape)
    h = h.encode()
    h += b" " * ((-(10 + len(h) + 1)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h + data


def make_inputs(d, kiln):
    """Writes the models and files of the matrix into `d`; returns their paths by name."""
    rng = np.random.default_rng(0)
    p = {}
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "W")
    g = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["M"]), helper.make_node("Relu", ["M"], ["Y"])],
                          "mlp", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 4])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 3])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="kiln-test")
    m.ir_version = 8
    onnx.checker.check_model(m)
    p["onnx"] = os.path.join(d, "mlp.onnx")
    onnx.save(m, p["onnx"])
    # a model with an int64 input and an external-data weight
    ext = numpy_helper.from_array(rng.standard_normal((5, 2)).astype(np.float32), "T")
    g2 = helper.make_graph([helper.make_node("Gather", ["T", "I"], ["Y"], axis=0)], "gather",
                           [helper.make_tensor_value_info("I", TensorProto.INT64, [3])],
                           [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 2])], [ext])
    m2 = helper.make_model(g2, opset_imports=[helper.make_opsetid("", 17)])
    m2.ir_version = 8
    p["ext_onnx"] = os.path.join(d, "ext", "gather.onnx")
    os.makedirs(os.path.dirname(p["ext_onnx"]))
    onnx.save(m2, p["ext_onnx"], save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
              size_threshold=0)
    p["ext_onnx_short"] = os.path.join(d, "ext_short", "gather.onnx")
    shutil.copytree(os.path.dirname(p["ext_onnx"]), os.path.dirname(p["ext_onnx_short"]))
    with open(os.path.join(d, "ext_short", "w.bin"), "r+b") as f:
        f.truncate(12)
    p["ext_onnx_missing"] = os.path.join(d, "ext_missing", "gather.onnx")
    os.makedirs(os.path.dirname(p["ext_onnx_missing"]))
    shutil.copy(p["ext_onnx"], p["ext_onnx_missing"])

    # shapes past any memory (2^52 elements: more than any address space, even with overcommit),
    # or whose element count overflows: declared by an input, or computed by an Expand
    for name, shape in [("huge_input", [999999999999, 999999999999]), ("big_input", [2**31, 2**31]),
                        ("large_input", [2**26, 2**26])]:
        gi = helper.make_graph([helper.make_node("Relu", ["X"], ["Y"])], name,
                               [helper.make_tensor_value_info("X", TensorProto.FLOAT, shape)],
                               [helper.make_tensor_value_info("Y", TensorProto.FLOAT, shape)])
        mi = helper.make_model(gi, opset_imports=[helper.make_opsetid("", 17)])
        mi.ir_version = 8
        p[name] = os.path.join(d, name + ".onnx")
        onnx.save(mi, p[name])
    for name, shape in [("expand_huge", [2**31, 2**31]), ("expand_large", [2**26, 2**26])]:
        s = numpy_helper.from_array(np.array(shape, np.int64), "S")
        ge = helper.make_graph([helper.make_node("Expand", ["X", "S"], ["E"]),
                                helper.make_node("ReduceSum", ["E"], ["Y"], keepdims=0)], name,
                               [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1])],
                               [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [])], [s])
        me = helper.make_model(ge, opset_imports=[helper.make_opsetid("", 13)])
        me.ir_version = 8
        p[name] = os.path.join(d, name + ".onnx")
        onnx.save(me, p[name])

    p["kiln"] = os.path.join(d, "mlp.kiln")
    r = subprocess.run([kiln, "convert", p["onnx"], "--shape", "X=2,4", "-o", p["kiln"]], capture_output=True,
                       text=True, timeout=TIMEOUT)
    if r.returncode != 0:
        sys.exit(f"cannot make the package: {r.stderr}")
    onnx_bytes = open(p["onnx"], "rb").read()
    kiln_bytes = open(p["kiln"], "rb").read()

    def put(name, data):
        p[name] = os.path.join(d, name)
        with open(p[name], "wb") as f:
            f.write(data)

    put("empty.onnx", b"")
    put("empty.kiln", b"")
    put("empty.npy", b"")
    put("trunc.onnx", onnx_bytes[: len(onnx_bytes) // 2])
    put("trunc.kiln", kiln_bytes[: len(kiln_bytes) // 2])
    put("header_only.kiln", kiln_bytes[:64])
    put("magic_only.kiln", kiln_bytes[:8])
    put("badmagic.kiln", b"KILNPKX\0" + kiln_bytes[8:])
    put("flipped.kiln", kiln_bytes[:200] + bytes([kiln_bytes[200] ^ 0x40]) + kiln_bytes[201:])
    put("random.onnx", rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
    put("text.onnx", b"this is not a model\n")
    put("kilnmagic.onnx", kiln_bytes[:100])
    p["dir"] = os.path.join(d, "adir")
    os.makedirs(p["dir"])
    for name in ("dir.kiln", "dir.onnx", "dir.npy"):
        p[name] = os.path.join(d, name)
        os.makedirs(p[name])
    p["missing"] = os.path.join(d, "no", "such", "model.onnx")
    p["missing.kiln"] = os.path.join(d, "nosuch.kiln")
    p["missing.npy"] = os.path.join(d, "nosuch.npy")

    # feeds
    np.save(os.path.join(d, "x.npy"), rng.standard_normal((2, 4)).astype(np.float32))
    p["x.npy"] = os.path.join(d, "x.npy")
    for name, arr in {
        "x_i64.npy": np.ones((2, 4), np.int64), "x_f64.npy": np.ones((2, 4)), "x_bool.npy": np.ones((2, 4), bool),
        "x_3x5.npy": np.ones((3, 5), np.float32), "x_rank1.npy": np.ones(8, np.float32),
        "x_rank3.npy": np.ones((1, 2, 4), np.float32), "x_scalar.npy": np.float32(1).reshape(()),
        "x_0x4.npy": np.zeros((0, 4), np.float32), "x_big_endian.npy": np.ones((2, 4), ">f4"),
        "x_complex.npy": np.ones((2, 4), np.complex64), "x_fortran.npy": np.asfortranarray(np.ones((2, 4), np.float32)),
        "x_str.npy": np.array(["ab", "cd"]), "i_i64.npy": np.array([0, 4, 2], np.int64),
        "i_oob.npy": np.array([0, 99, -77], np.int64), "i_f32.npy": np.zeros(3, np.float32),
    }.items():
        np.save(os.path.join(d, name), arr)
        p[name] = os.path.join(d, name)
    full = open(p["x.npy"], "rb").read()
    put("x_trunc.npy", full[:-3])
    put("x_trunc_header.npy", full[:20])
    put("x_badmagic.npy", b"\x93NUMPX" + full[6:])
    put("x_badversion.npy", full[:6] + b"\x09\x00" + full[8:])
    put("x_hlen.npy", full[:8] + b"\xff\xff" + full[10:])
    put("x_huge.npy", npy_header("<f4", "(999999999999999, 999999999999999)"))
    put("x_overflow.npy", npy_header("<f8", "(0, 999999999999999, 999999999999999, 999999999999999)"))
    put("x_2e31.npy", npy_header("<f4", "(2147483648, 2147483648)"))
    put("x_negative.npy", npy_header("<f4", "(-2, 4)", data=b"\0" * 32))
    put("x_noshape.npy", npy_header("<f4", "", data=b"\0" * 32))
    put("x_descr.npy", npy_header("<q16", "(2, 4)", data=b"\0" * 32))
    put("x_rank64.npy", npy_header("<f4", "(" + "1, " * 64 + ")", data=b"\0" * 4))
    p["calib"] = os.path.join(d, "calib")
    os.makedirs(p["calib"])
    np.save(os.path.join(p["calib"], "b0.npy"), rng.standard_normal((2, 4)).astype(np.float32))
    for name, files in {"calib_bad": {"b0.npy": open(p["x_huge.npy"], "rb").read()},
                        "calib_dtype": {"b0.npy": open(p["x_i64.npy"], "rb").read()},
                        "calib_shape": {"b0.npy": open(p["x_3x5.npy"], "rb").read()},
                        "calib_mixed": {"b0.npy": full, "b1.npy": open(p["x_rank3.npy"], "rb").read()},
                        "calib_empty": {}, "calib_trunc": {"b0.npy": full[:-3]}}.items():
        p[name] = os.path.join(d, name)
        os.makedirs(p[name])
        for f, data in files.items():
            with open(os.path.join(p[name], f), "wb") as out:
                out.write(data)
    # demo data folders
    for name, (images, labels) in {
        "digits_scalar": (np.float32(1).reshape(()), np.int64(1).reshape(())),
        "digits_flat": (np.zeros((50, 64), np.float32), np.zeros(50, np.int64)),
        "digits_few_labels": (np.zeros((50, 1, 8, 8), np.float32), np.zeros(3, np.int64)),
        "digits_f32_labels": (np.zeros((50, 1, 8, 8), np.float32), np.zeros(50, np.float32)),
        "digits_i64_images": (np.zeros((50, 1, 8, 8), np.int64), np.zeros(50, np.int64)),
        "digits_empty": (np.zeros((0, 1, 8, 8), np.float32), np.zeros(0, np.int64)),
        "digits_labels_oob": (np.zeros((50, 1, 8, 8), np.float32), np.full(50, 1000, np.int64)),
    }.items():
        p[name] = os.path.join(d, name)
        os.makedirs(p[name])
        np.save(os.path.join(p[name], "digits_images.npy"), images)
        np.save(os.path.join(p[name], "digits_labels.npy"), labels)
    p["digits_bad_npy"] = os.path.join(d, "digits_bad_npy")
    os.makedirs(p["digits_bad_npy"])
    shutil.copy(p["x_huge.npy"], os.path.join(p["digits_bad_npy"], "digits_images.npy"))
    shutil.copy(p["x_huge.npy"], os.path.join(p["digits_bad_npy"], "digits_labels.npy"))
    p["file_not_dir"] = p["x.npy"]
    p["/dev/zero"] = "/dev/zero"  # never ends: must be refused, not read
    p["/dev/null"] = "/dev/null"
    return p


def cases(p, d):
    """(args, ok_allowed) for every case."""
    c = []
    bad_models = ["missing", "missing.kiln", "empty.onnx", "empty.kiln", "trunc.onnx", "trunc.kiln", "header_only.kiln",
                  "magic_only.kiln", "badmagic.kiln", "flipped.kiln", "random.onnx", "text.onnx", "kilnmagic.onnx",
                  "dir", "dir.kiln", "dir.onnx", "ext_onnx_short", "ext_onnx_missing", "/dev/zero", "/dev/null",
                  "huge_input", "big_input", "expand_huge"]
    model_cmds = {"run": ["run"], "bench": ["bench", "-n", "1", "-w", "0"], "profile": ["profile", "--runs", "1"],
                  "inspect": ["inspect"], "inspect-json": ["inspect", "--json"], "convert": ["convert"],
                  "quantize": ["quantize", "--calibrate", p["calib"]]}
    for cmd in model_cmds.values():
        for m in bad_models:
            c.append((cmd + [p[m]], False))
        c.append((cmd + [""], False))
        c.append((cmd + [p["onnx"], "--bogus-flag"], False))
        c.append((cmd + [p["onnx"], "--shape", "Nope=2,4"], False))
        c.append((cmd + [p["onnx"], "--shape", "X=abc"], False))
        c.append((cmd + [p["onnx"], "--shape", "X"], False))
        c.append((cmd + [p["onnx"], "--shape", "X=999999999999999999,999999999999999999"], False))
        c.append((cmd + [p["onnx"], "--shape", "X=2,4,4"], False))
        c.append((cmd + [p["onnx"], "--shape", "X=3,5"], False))
        c.append((cmd + [p["onnx"], "--value", "Nope=" + p["x.npy"]], False))
        c.append((cmd + [p["onnx"], "--value", "X=" + p["x_huge.npy"]], False))
        c.append((cmd + [p["onnx"], "--device", "tpu:0"], False))
        c.append((cmd + [p["onnx"], "--device", "cuda:99"], False))
        c.append((cmd + [p["onnx"], "--device", "cpu:-1x"], False))
        c.append((cmd + [p["kiln"], "--shape", "X=3,4"], False))
        c.append((cmd + [p["kiln"], "--value", "X=" + p["x.npy"]], False))
    feed_cmds = {"run": ["run"], "bench": ["bench", "-n", "1", "-w", "0"], "profile": ["profile", "--runs", "1"]}
    bad_feeds = ["x_i64.npy", "x_f64.npy", "x_bool.npy", "x_3x5.npy", "x_rank1.npy", "x_rank3.npy", "x_scalar.npy",
                 "x_big_endian.npy", "x_complex.npy", "x_fortran.npy", "x_str.npy", "x_trunc.npy",
                 "x_trunc_header.npy", "x_badmagic.npy", "x_badversion.npy", "x_hlen.npy", "x_huge.npy",
                 "x_overflow.npy", "x_2e31.npy", "x_negative.npy", "x_noshape.npy", "x_descr.npy", "x_rank64.npy",
                 "empty.npy", "missing.npy", "dir.npy", "/dev/zero", "/dev/null"]
    for cmd in feed_cmds.values():
        for model in ("onnx", "kiln"):
            for f in bad_feeds:
                c.append((cmd + [p[model], "--input", "X=" + p[f]], f in ("x_0x4.npy",)))
            c.append((cmd + [p[model], "--input", "Nope=" + p["x.npy"]], False))
            c.append((cmd + [p[model], "--input", "X=" + p["x.npy"], "--input", "X=" + p["x.npy"]], False))
            c.append((cmd + [p[model], "--input", "X"], False))
            c.append((cmd + [p[model], "--input", "=" + p["x.npy"]], False))
            c.append((cmd + [p[model], "--input", "X="], False))
        c.append((cmd + [p["onnx"], "--input", "X=" + p["x_0x4.npy"]], True))
        c.append((cmd + [p["large_input"]], False))
        c.append((cmd + [p["expand_large"]], False))
        c.append((cmd + [p["ext_onnx"], "--input", "I=" + p["i_oob.npy"]], False))
        c.append((cmd + [p["ext_onnx"], "--input", "I=" + p["i_f32.npy"]], False))
    c += [
        (["run", p["onnx"], "--output-dir", p["x.npy"]], False),
        (["run", p["onnx"], "--output-dir", os.path.join(p["x.npy"], "sub")], False),
        (["run", p["onnx"], "--seed", "-1"], True),
        (["run", p["onnx"], "--seed", "abc"], False),
        (["bench", p["onnx"], "-n", "-5"], False),
        (["bench", p["onnx"], "-n", "0", "-w", "0"], False),
        (["bench", p["onnx"], "-w", "-1", "-n", "1"], False),
        (["bench", p["onnx"], "-n", "99999999999999999999"], False),
        (["profile", p["onnx"], "--runs", "0"], False),
        (["profile", p["onnx"], "--runs", "-3"], False),
        (["profile", p["onnx"], "--runs", "1", "--trace", os.path.join(d, "no", "dir", "t.json")], False),
        (["profile", p["onnx"], "--runs", "1", "--trace", p["dir"]], False),
        (["profile", p["onnx"], "--runs", "1", "--html", os.path.join(d, "no", "dir", "t.html")], False),
        (["profile", p["onnx"], "--runs", "1", "--cpu-op", "nosuchop"], False),
        (["profile", p["onnx"], "--runs", "1", "--gap-us", "-3"], False),
        (["convert", p["onnx"], "-o", os.path.join(d, "no", "dir", "out.kiln")], False),
        (["convert", p["onnx"], "-o", p["dir"]], False),
        (["convert", p["onnx"], "-o", ""], True),  # no -o: checks the model only
        (["convert", p["kiln"], "-o", os.path.join(d, "again.kiln")], False),
        (["inspect", p["kiln"], "--dump", "--json"], True),
        (["quantize", p["onnx"]], False),
        (["quantize", p["onnx"], "--calibrate", p["missing"]], False),
        (["quantize", p["onnx"], "--calibrate", p["x.npy"]], False),
        (["quantize", p["onnx"], "--calibrate", p["calib_empty"]], False),
        (["quantize", p["onnx"], "--calibrate", p["calib_bad"]], False),
        (["quantize", p["onnx"], "--calibrate", p["calib_dtype"]], False),
        (["quantize", p["onnx"], "--calibrate", p["calib_shape"]], False),
        (["quantize", p["onnx"], "--calibrate", p["calib_mixed"]], False),
        (["quantize", p["onnx"], "--calibrate", p["calib_trunc"]], False),
        (["quantize", p["onnx"], "--calibrate", p["calib"], "--method", "bogus"], False),
        (["quantize", p["onnx"], "--calibrate", p["calib"], "--method", "percentile", "--percentile", "200"], False),
        (["quantize", p["onnx"], "--calibrate", p["calib"], "--method", "percentile", "--percentile", "nan"], False),
        (["quantize", p["onnx"], "--calibrate", p["calib"], "--activations", "u9"], False),
        (["quantize", p["onnx"], "--calibrate", p["calib"], "--per-channel", "--per-tensor"], False),
        (["quantize", p["onnx"], "--calibrate", p["calib"], "--exclude", "nosuchnode"], True),
        (["quantize", p["onnx"], "--calibrate", p["calib"], "-o", os.path.join(d, "no", "dir", "q.kiln")], False),
        (["quantize", p["ext_onnx"], "--calibrate", p["calib"]], False),
        (["ops", "--bogus"], False),
        (["ops", "extra"], False),
        (["nosuchcommand"], False),
        (["--bogus"], False),
        (["run"], False),
        (["run", p["onnx"], p["onnx"]], False),
        (["demo", "--data", p["missing"]], False),
        (["demo", "--data", p["dir"]], False),
        (["demo", "--data", p["file_not_dir"]], False),
        (["demo", "--data", p["digits_bad_npy"]], False),
        (["demo", "--epochs", "0"], False),
        (["demo", "--batch", "0"], False),
        (["demo", "--batch", "abc"], False),
        (["demo", "--autocast", "f8"], False),
        (["demo", "--device", "tpu"], False),
        (["demo", "--lr", "abc"], False),
        (["launch"], False),
        (["launch", "-n", "0", "--", "true"], False),
        (["launch", "-n", "abc", "--", "true"], False),
        (["launch", "-n", "1", "--", os.path.join(d, "no", "such", "program")], False),
        (["launch", "-n", "1", "--", "kiln-no-such-program-anywhere"], False),
        (["launch", "-n", "1", "--", p["dir"]], False),
        (["launch", "-n", "1", "--", p["x.npy"]], False),
    ]
    for name in ("digits_scalar", "digits_flat", "digits_few_labels", "digits_f32_labels", "digits_i64_images",
                 "digits_empty", "digits_labels_oob"):
        c.append((["demo", "--data", p[name], "--epochs", "1", "--batch", "8", "--checkpoint",
                   os.path.join(d, name + ".ckpt")], False))
    return c


def check(kiln, args, ok_allowed, env, verbose=False):
    try:
        r = subprocess.run([kiln, *args], capture_output=True, text=True, timeout=TIMEOUT, env=env,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"hung (over {TIMEOUT} s)"
    # allocator_may_return_null=1: ASan warns that a huge allocation failed, then kiln reports it
    err = "\n".join(l for l in r.stderr.splitlines() if not ASAN_ALLOC_WARNING.match(l))
    lines = [l for l in err.splitlines() if l.strip()]
    if r.returncode < 0:
        return f"killed by signal {-r.returncode}: {err[-2000:]}"
    if any(m in err for m in SANITIZER_MARKS):
        return f"sanitizer report or abort (status {r.returncode}): {err[-4000:]}"
    if verbose:
        print(f"{r.returncode} kiln {' '.join(args)}\n  {lines[-1] if lines else ''}", flush=True)
    if r.returncode == 0:
        return None if ok_allowed else f"succeeded (status 0); stdout: {r.stdout[-500:]}"
    if r.returncode != 1:
        return f"exit status {r.returncode}, not 1: {err[-2000:]}"
    if len(lines) != 1:
        return f"{len(lines)} lines on stderr, not 1: {err[-2000:]}"
    if not lines[0].startswith("error: ["):
        return f"the error line does not start with 'error: [component]': {lines[0]}"
    return None


def main():
    kiln = os.path.abspath(sys.argv[1])
    work = sys.argv[2] if len(sys.argv) > 2 else None
    d = tempfile.mkdtemp(prefix="kiln-crash-matrix-", dir=work)
    env = dict(os.environ)
    env.setdefault("KILN_THREADS", "2")
    # an absurd size is an OutOfMemory error, as in a release build, not an ASan abort
    env["ASAN_OPTIONS"] = ":".join(filter(None, [env.get("ASAN_OPTIONS", ""), "allocator_may_return_null=1"]))
    env["UBSAN_OPTIONS"] = ":".join(filter(None, [env.get("UBSAN_OPTIONS", ""), "print_stacktrace=1"]))
    try:
        p = make_inputs(d, kiln)
        all_cases = cases(p, d)
        jobs = int(os.environ.get("KILN_MATRIX_JOBS", "2"))
        failures = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            verbose = bool(os.environ.get("KILN_MATRIX_VERBOSE"))
            futures = {pool.submit(check, kiln, args, ok, env, verbose): args for args, ok in all_cases}
            for f in concurrent.futures.as_completed(futures):
                why = f.result()
                if why:
                    failures.append((futures[f], why))
        for args, why in failures:
            print("FAIL: kiln " + " ".join(a.replace(d, "$TMP") for a in args) + "\n  " + why.replace(d, "$TMP"))
        print(f"{len(all_cases) - len(failures)} of {len(all_cases)} cases gave one error line and status 1"
              f" (or a success where allowed)")
        return 1 if failures else 0
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
