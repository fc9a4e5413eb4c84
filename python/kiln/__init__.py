"""kiln: build, compile and run machine-learning compute graphs on CPUs and NVIDIA GPUs.

    import numpy as np, kiln
    g = kiln.Graph()
    x = g.placeholder([None, 4], kiln.f32, "x")
    w = g.variable(np.random.randn(3, 4).astype(np.float32), "w")
    y = kiln.softmax(kiln.linear(x, w))
    exe = g.compile([y], feed_shapes={x: (8, 4)}, device="cpu")
    probs = exe.run({x: np.ones((8, 4), np.float32)})[0].numpy()

The native module (kiln._kiln) holds the bindings; this package re-exports them. See
docs/python.md.
"""
# (the native module is loaded without RTLD_GLOBAL: the protobuf and ONNX libraries it links
# stay out of the onnx package's way; load_op_library puts kiln's own symbols in the global scope
# when a custom-op library needs them)
from . import _kiln  # noqa: F401
from ._kiln import *  # noqa: F401,F403
from ._kiln import (  # noqa: F401  (names the star import leaves out)
    __version__,
    Error,
    ShapeError,
    DTypeError,
    UnsupportedError,
    IoError,
    FormatError,
    OutOfMemory,
    DeviceError,
    ValueError,
)
import importlib as _importlib  # noqa: E402

# the star import bound kiln.llm, kiln.onnx and kiln.coreml to the native submodules: load the
# Python modules that wrap them (an import of the files, not a lookup of the attribute)
llm = _importlib.import_module(".llm", __name__)
onnx = _importlib.import_module(".onnx", __name__)
coreml = _importlib.import_module(".coreml", __name__)
from . import optim  # noqa: E402
from . import extensions  # noqa: E402

f32 = DType.f32  # noqa: F405
f16 = DType.f16  # noqa: F405
bf16 = DType.bf16  # noqa: F405
f64 = DType.f64  # noqa: F405
i8 = DType.i8  # noqa: F405
u8 = DType.u8  # noqa: F405
i16 = DType.i16  # noqa: F405
i32 = DType.i32  # noqa: F405
i64 = DType.i64  # noqa: F405
u16 = DType.u16  # noqa: F405
u32 = DType.u32  # noqa: F405
u64 = DType.u64  # noqa: F405
bool_ = DType.bool  # noqa: F405
boolean = bool_
# the 8-bit floats (storage types: cast them to compute; numpy sees ml_dtypes' types)
f8e4m3fn = DType.f8e4m3fn  # noqa: F405
f8e4m3fnuz = DType.f8e4m3fnuz  # noqa: F405
f8e5m2 = DType.f8e5m2  # noqa: F405
f8e5m2fnuz = DType.f8e5m2fnuz  # noqa: F405
# the other narrow storage types, one element a byte as ml_dtypes holds them
f8e8m0fnu = DType.f8e8m0fnu  # noqa: F405
f4e2m1fn = DType.f4e2m1fn  # noqa: F405
i4 = DType.i4  # noqa: F405
u4 = DType.u4  # noqa: F405
i2 = DType.i2  # noqa: F405
u2 = DType.u2  # noqa: F405

cpu = Device.cpu()  # noqa: F405


def cuda(index: int = 0) -> "Device":  # noqa: F405
    """The CUDA device `index`."""
    return Device.cuda(index)  # noqa: F405


def load(path: str, device=None) -> "Executable":  # noqa: F405
    """Loads a .kiln package (Executable.load)."""
    return Executable.load(path, device)  # noqa: F405
