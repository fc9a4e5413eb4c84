#!/usr/bin/env python3
"""Writes the .npy fuzz seed corpus: small valid files of every dtype kiln reads, format versions
1.0, 2.0 and 3.0, scalars, empty and 0-size arrays, and the malformed kinds a reader must refuse:
Fortran order, big-endian and unknown dtypes, truncated headers and data, header lengths past the
end, absurd and overflowing shapes, bad magic and versions. Deterministic (fixed seed).
The corpus also keeps found_*.npy: inputs of 30-minute runs that reached code the seeds do not
(fuzz_npy_read -merge=1), kept as they are. Usage: make_npy_corpus.py OUT_DIR"""
import io
import os
import struct
import sys

import numpy as np

MAGIC = b"\x93NUMPY"


def npy(arr, version=None):
    f = io.BytesIO()
    if version is None:
        np.save(f, arr)
    else:
        np.lib.format.write_array(f, arr, version=version)
    return f.getvalue()


def raw(header, data=b"", version=1, hlen=None):
    """A file with a hand-written header dict (padded like numpy's) and `hlen` if given."""
    h = header.encode("latin1")
    prefix = 10 if version == 1 else 12
    pad = (-(prefix + len(h) + 1)) % 64
    h = h + b" " * pad + b"\n"
    n = len(h) if hlen is None else hlen
    size = struct.pack("<H", n) if version == 1 else struct.pack("<I", n)
    return MAGIC + bytes([version, 0]) + size + h + data


def seeds():
    rng = np.random.default_rng(0)
    for dt in ["<f4", "<f2", "<f8", "|i1", "|u1", "<i2", "<i4", "<i8", "|b1"]:
        a = (rng.standard_normal((2, 3)) * 4).astype(dt)
        yield f"{dt[1:]}_2x3", npy(a)
    yield "f4_scalar", npy(np.float32(1.5).reshape(()))
    yield "f4_empty", npy(np.zeros((0,), np.float32))
    yield "i8_0x3", npy(np.zeros((0, 3), np.int64))
    yield "f4_rank4", npy(rng.standard_normal((1, 2, 1, 3)).astype(np.float32))
    yield "f4_fortran_c_copy", npy(np.asfortranarray(rng.standard_normal((3, 2)).astype(np.float32)).copy(order="C"))
    yield "f4_v2", npy(np.arange(6, dtype=np.float32).reshape(2, 3), version=(2, 0))
    yield "f4_v3", npy(np.arange(4, dtype=np.float32), version=(3, 0))
    yield "bf16_v2", raw("{'descr': '<V2', 'fortran_order': False, 'shape': (2,), }", b"\x80\x3f\x00\x40")
    yield "bf16_name", raw("{'descr': 'bfloat16', 'fortran_order': False, 'shape': (1,), }", b"\x80\x3f")
    # refused
    yield "fortran", npy(np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)))
    yield "big_endian", npy(np.arange(3, dtype=">f4"))
    yield "complex", npy(np.arange(2, dtype=np.complex64))
    yield "unicode", npy(np.array(["ab", "c"]))
    full = npy(np.arange(12, dtype=np.float32).reshape(3, 4))
    yield "trunc_magic", full[:5]
    yield "trunc_hlen", full[:9]
    yield "trunc_header", full[:40]
    yield "trunc_data", full[:-5]
    yield "bad_magic", b"\x93NUMPX" + full[6:]
    yield "bad_version", full[:6] + b"\x07\x00" + full[8:]
    yield "hlen_past_end", raw("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", b"\0" * 4, hlen=60000)
    yield "hlen_past_end_v2", raw("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", b"\0" * 4, version=2,
                                  hlen=0xFFFFFFF0)
    yield "shape_huge", raw("{'descr': '<f4', 'fortran_order': False, 'shape': (999999999999999, 999999999999999), }")
    yield "shape_zero_huge", raw("{'descr': '<f8', 'fortran_order': False, 'shape': (0, 999999999999999, "
                                 "999999999999999, 999999999999999), }")
    yield "shape_negative", raw("{'descr': '<f4', 'fortran_order': False, 'shape': (-1, 2), }", b"\0" * 8)
    yield "shape_rank64", raw("{'descr': '|u1', 'fortran_order': False, 'shape': (" + "1, " * 64 + "), }", b"\7")
    yield "shape_unclosed", raw("{'descr': '<f4', 'fortran_order': False, 'shape': (3, ", b"\0" * 12)
    yield "no_descr", raw("{'fortran_order': False, 'shape': (1,), }", b"\0" * 4)
    yield "empty_descr", raw("{'descr': '', 'fortran_order': False, 'shape': (1,), }", b"\0" * 4)
    yield "descr_one_char", raw("{'descr':', 'fortran_order': False, 'shape': (1,), }", b"\0" * 4)
    yield "empty_header", raw("", b"")
    yield "data_short", raw("{'descr': '<i8', 'fortran_order': False, 'shape': (4, 4), }", b"\1" * 100)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, data in seeds():
        with open(os.path.join(out, name + ".npy"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
