#!/usr/bin/env python3
"""Writes python/src/op_docs.inc, the docstrings of the Python module's op functions, from the `///`
comments of the op declarations in include/kiln/ops/*.h.

A declaration's doc is the run of `///` lines directly above it, without the `/// ` prefix and
with its line breaks kept. The docs of overloads (split, quantize, ...) are joined in header
order, each text once, with a blank line between them. The table holds one line per op name,
sorted: KILN_OP_DOC("name", "doc"). python/src/ops.cpp turns it into op_doc(name).

    op_docs.py [--check] [--missing] [repo root]

--check writes nothing: it prints how the table differs from what the headers give and exits 1
when it does. --missing lists the op declarations that have no `///` comment (and exits 1 when
there are any).
"""
import difflib
import pathlib
import re
import sys

HEADERS = "include/kiln/ops/*.h"
TABLE = "python/src/op_docs.inc"

# A function declaration at namespace level: a return type (Tensor, std::vector<Tensor>,
# std::pair<Tensor, Tensor>, RandomResult, ...), the name, then "(". Operators are left out.
DECL = re.compile(r"^(?:[A-Za-z_][\w:]*(?:<[^()]*>)?)\s+([a-z_][a-z0-9_]*)\(")
DOC = re.compile(r"^\s*///(?: ?)(.*)$")


def declarations(root):
    """(name, doc or None, file, line) of every op declaration, in header order."""
    out = []
    for path in sorted(root.glob(HEADERS)):
        doc = []
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            m = DOC.match(line)
            if m:
                doc.append(m.group(1).rstrip())
                continue
            d = DECL.match(line)
            if d and d.group(1) != "operator":
                text = "\n".join(doc).strip()
                out.append((d.group(1), text or None, str(path.relative_to(root)), i))
            doc = []
    return out


def docs(root):
    """{name: doc} with the docs of overloads joined, each text once."""
    joined = {}
    for name, text, _, _ in declarations(root):
        if text is None:
            continue
        parts = joined.setdefault(name, [])
        if text not in parts:
            parts.append(text)
    return {name: "\n\n".join(parts) for name, parts in joined.items()}


def c_string(text):
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\{ord(ch):03o}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def table(root):
    lines = [
        "// The docstrings of the Python module's op functions: the `///` comments of their",
        "// declarations in include/kiln/ops/*.h. Written by scripts/op_docs.py; do not edit.",
        "// KILN_OP_DOC(name, doc), sorted by name.",
    ]
    for name, text in sorted(docs(root).items()):
        lines.append(f"KILN_OP_DOC({c_string(name)}, {c_string(text)})")
    return "\n".join(lines) + "\n"


def main(argv):
    flags = {a for a in argv if a.startswith("--")}
    unknown = flags - {"--check", "--missing"}
    rest = [a for a in argv if not a.startswith("--")]
    if unknown or len(rest) > 1:
        print("usage: op_docs.py [--check] [--missing] [repo root]", file=sys.stderr)
        return 2
    root = pathlib.Path(rest[0] if rest else pathlib.Path(__file__).resolve().parents[1])
    if "--missing" in flags:
        missing = [(n, f, i) for n, t, f, i in declarations(root) if t is None]
        for name, f, i in missing:
            print(f"{f}:{i}: {name} has no /// comment")
        print(f"op docs: {len(missing)} op declarations without a /// comment")
        return 1 if missing else 0
    want = table(root)
    path = root / TABLE
    if "--check" in flags:
        have = path.read_text(encoding="utf-8") if path.exists() else ""
        if have == want:
            print(f"op docs: {TABLE} is as include/kiln/ops/*.h gives it")
            return 0
        sys.stdout.writelines(difflib.unified_diff(have.splitlines(True), want.splitlines(True),
                                                   TABLE, "from include/kiln/ops/*.h"))
        print(f"op docs: FAIL: {TABLE} is stale; python3 scripts/op_docs.py rewrites it")
        return 1
    path.write_text(want, encoding="utf-8")
    print(f"op docs: wrote {TABLE} ({len(want.splitlines()) - 3} ops)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
