"""Custom ops built from Python: C++ sources compiled into an op library and loaded, in one call.

    import kiln
    lib = kiln.extensions.load("my_ops", ["my_ops.cpp"])   # compiles once, then from the cache
    (y,) = kiln.custom_op("my.softshrink", [x], {"lambda": 0.25})

The sources define ops and their kernels with `KILN_OP_LIBRARY` (kiln/custom_op.h; see
docs/custom_ops.md). They are compiled with the C++ compiler `cxx` (default: `c++` on the PATH)
against the headers this package carries (`include_dir()`), as C++20, `-O2 -fPIC -shared`, and
linked with no kiln of their own: the library resolves kiln's symbols in the running process. The
library lands in `build_directory` (default: `~/.cache/kiln/extensions`) under a name that hashes
the sources, the flags, the compiler and kiln's version, so a second `load` of the same sources
reuses it and any change rebuilds it.
"""
import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile

from . import _kiln

__all__ = ["BuildError", "include_dir", "load"]


class BuildError(_kiln.Error):
    """The compiler failed (its output is the message) or could not be found."""


def include_dir() -> str:
    """The directory holding kiln's public C++ headers (kiln/custom_op.h, kiln/kiln.h, ...)."""
    return str(pathlib.Path(__file__).resolve().parent / "include")


def _cache_dir(build_directory):
    if build_directory is not None:
        return pathlib.Path(build_directory)
    return pathlib.Path.home() / ".cache" / "kiln" / "extensions"


def load(name: str, sources, extra_cflags=(), extra_ldflags=(), build_directory=None,
         cxx: str = "c++", verbose: bool = False) -> str:
    """Compiles `sources` (C++ files) into the op library `lib<name>-<hash>.so` unless the cache
    holds it already, loads it (kiln.load_op_library) and returns its path. Raises BuildError
    with the compiler's output when the build fails."""
    if not name or not all(ch.isalnum() or ch in "_-" for ch in name):
        raise ValueError(f"extension name {name!r}: letters, digits, '_' and '-' only")
    sources = [pathlib.Path(s) for s in ([sources] if isinstance(sources, (str, os.PathLike))
                                         else sources)]
    if not sources:
        raise ValueError("no sources to build")
    for s in sources:
        if not s.is_file():
            raise FileNotFoundError(f"extension source {s} does not exist")
        if s.suffix not in (".cpp", ".cc", ".cxx"):
            raise ValueError(f"extension source {s}: only C++ sources (.cpp, .cc, .cxx)")
    if shutil.which(cxx) is None:
        raise BuildError(f"[extensions] no C++ compiler '{cxx}' (the cxx argument) to build "
                         f"'{name}'")
    include = include_dir()
    if not (pathlib.Path(include) / "kiln" / "custom_op.h").is_file():
        raise BuildError(f"[extensions] kiln's headers are not in {include}")
    flags = ["-std=c++20", "-O2", "-fPIC", "-shared", "-I", include, *extra_cflags]
    digest = hashlib.sha256()
    for part in (_kiln.__version__, cxx, *flags, *extra_ldflags):
        digest.update(str(part).encode() + b"\0")
    for s in sources:
        digest.update(s.read_bytes() + b"\0")
    out_dir = _cache_dir(build_directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / f"lib{name}-{digest.hexdigest()[:16]}.so"
    if not lib.exists():
        # built under a temporary name, then renamed: a concurrent load never sees half a file
        fd, tmp = tempfile.mkstemp(prefix=f".lib{name}-", suffix=".so", dir=out_dir)
        os.close(fd)
        cmd = [cxx, *flags, *[str(s) for s in sources], "-o", tmp, *extra_ldflags]
        if verbose:
            print(" ".join(cmd))
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            os.unlink(tmp)
            raise BuildError(f"[extensions] building '{name}' failed:\n{' '.join(cmd)}\n"
                             f"{r.stdout}{r.stderr}")
        os.replace(tmp, lib)
    _kiln.load_op_library(str(lib))
    return str(lib)
