"""Every binding is exercised: each public name of kiln._kiln, its submodules and its classes
appears in some test of this folder (a new binding without a test fails here)."""
import inspect
import pathlib
import re

import kiln
from kiln import _kiln

# names that are plumbing rather than API
IGNORED = {"__init__", "__new__", "__repr__", "__str__", "__eq__", "__ne__", "__hash__", "__len__"}


def public_names():
    names = set()
    for mod in (_kiln, _kiln.onnx, _kiln.optim):
        for name, obj in vars(mod).items():
            if name.startswith("_") or inspect.ismodule(obj):
                continue
            names.add(name)
            if inspect.isclass(obj) and not issubclass(obj, BaseException):
                for member in vars(obj):
                    if not member.startswith("_") or member in ("__dlpack__", "__dlpack_device__",
                                                                "__array__", "__getitem__", "__call__"):
                        names.add(member)
    return names - IGNORED


def test_every_binding_appears_in_a_test():
    here = pathlib.Path(__file__).parent
    text = "\n".join(p.read_text() for p in here.glob("test_*.py") if p.name != "test_coverage.py")
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))
    # operators and protocols show up as syntax, not names
    words |= {"__getitem__", "__array__", "__call__", "__dlpack__"}
    missing = sorted(n for n in public_names() if n not in words)
    assert not missing, f"bindings without a test: {missing}"
