"""Every op function of the module has the docstring of its C++ declaration (include/kiln/ops/*.h,
through python/src/op_docs.inc, which scripts/op_docs.py writes), and its signature line names
the arguments."""
import importlib.util
import pathlib
import re

import pytest

import kiln

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINDINGS = ("python/src/ops.cpp", "python/src/ops_nn.cpp")


def _op_docs_script():
    spec = importlib.util.spec_from_file_location("op_docs", ROOT / "scripts" / "op_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


OP_DOCS = _op_docs_script()
HEADER_DOCS = OP_DOCS.docs(ROOT)


def bound_names():
    """The op names the bindings define by name: m.def("name", ...), KILN_REDUCE(name) and the
    conv templates (the elementwise records come in through the table's names)."""
    names = set()
    for path in BINDINGS:
        text = (ROOT / path).read_text()
        names.update(re.findall(r'm\.def\(\s*"(\w+)"', text))
        names.update(re.findall(r"^\s*KILN_REDUCE\((\w+)\);", text, re.M))
        names.update(re.findall(r'conv(?:_transpose)?<&kiln::\w+>\(m, "(\w+)"\)', text))
    return names


def op_functions():
    """Names of the module's op functions: those of the table the module has, and every name
    the bindings define."""
    return sorted({n for n in HEADER_DOCS if hasattr(kiln, n)} | bound_names())


def doc_text(fn):
    """The docstring nanobind was given (without the signature line it adds to __doc__)."""
    return fn.__nb_signature__[0][1] or ""


def first_sentence(text):
    words = " ".join(text.split())
    m = re.match(r"(.+?\.)(\s|$)", words)
    return m.group(1) if m else words


def flat(text):
    return " ".join(text.split())


def test_table_is_current():
    assert (ROOT / OP_DOCS.TABLE).read_text(encoding="utf-8") == OP_DOCS.table(ROOT), (
        "python/src/op_docs.inc is stale: python3 scripts/op_docs.py rewrites it")


def test_every_bound_op_has_a_header_doc():
    names = bound_names()
    assert len(names) > 80  # the bindings were read
    assert sorted(n for n in names if n not in HEADER_DOCS) == []


def test_op_functions_have_docstrings():
    names = op_functions()
    assert len(names) > 150  # elementwise, reductions, transforms, nn, random, rnn
    missing = [n for n in names if not hasattr(kiln, n)]
    assert missing == []
    undocumented = [n for n in names if not doc_text(getattr(kiln, n)).strip()]
    assert undocumented == [], f"{len(undocumented)} op functions without a docstring"


@pytest.mark.parametrize("name", op_functions())
def test_docstring_is_the_header_comment(name):
    fn = getattr(kiln, name)
    want = HEADER_DOCS[name]
    assert first_sentence(want) in flat(fn.__doc__)
    assert doc_text(fn) == want


@pytest.mark.parametrize("name, args", [
    ("conv2d", ["x", "w", "bias", "stride", "padding", "dilation", "groups", "pad_mode"]),
    ("gelu", ["x", "approximate"]),
    ("sum", ["x", "axes", "keepdims"]),
    ("add", ["a", "b"]),
    ("random_uniform", ["state", "shape", "min", "max", "dtype"]),
])
def test_signature_names_the_arguments(name, args):
    fn = getattr(kiln, name)
    # nanobind's __doc__ starts with the signature, then a blank line and the docstring
    signature, _, rest = fn.__doc__.partition("\n")
    assert signature.startswith(f"{name}(")
    assert re.findall(r"[(,]\s*(\w+):", signature) == args
    assert flat(rest).startswith(first_sentence(HEADER_DOCS[name]))
    assert fn.__nb_signature__[0][0].startswith(f"def {name}(")


def test_help_shows_the_docstring():
    import pydoc

    text = pydoc.render_doc(kiln.conv2d, renderer=pydoc.plaintext)
    assert "pad_mode" in text
    assert first_sentence(HEADER_DOCS["conv2d"]) in flat(text)
