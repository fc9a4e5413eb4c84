"""Core ML import: kiln.coreml.load(path) gives a Model (a kiln Graph with named inputs/outputs)
from an .mlpackage (ML Program) or .mlmodel file."""
from ._kiln.coreml import *  # noqa: F401,F403
from ._kiln.coreml import (  # noqa: F401
    Model, ValueInfo, available, load, load_bytes, supported_layers, supported_ops,
)
