"""ONNX import: kiln.onnx.load(path) gives a Model (a kiln Graph with named inputs/outputs)."""
from ._kiln.onnx import *  # noqa: F401,F403
from ._kiln.onnx import (  # noqa: F401
    Model, Session, ValueInfo, load, load_bytes, supported_ops, is_supported,
)
