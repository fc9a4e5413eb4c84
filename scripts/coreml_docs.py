#!/usr/bin/env python3
"""Writes the table of MIL ops kiln's Core ML importer maps into docs/coreml.md (between the
`<!-- ops -->` markers), from the built package's kiln.coreml.supported_ops(); --check exits 1
when the file differs (python/tests/test_coreml.py checks the same).

    PYTHONPATH=build/python coreml_docs.py [--check] [DOCS]"""
import pathlib
import sys

BEGIN, END = "<!-- ops -->", "<!-- /ops -->"
COLUMNS = 5


def table(ops):
    rows = ["| " + " | ".join(["MIL op"] * COLUMNS) + " |", "|" + "---|" * COLUMNS]
    for k in range(0, len(ops), COLUMNS):
        cells = [f"`{o}`" for o in ops[k:k + COLUMNS]]
        cells += [""] * (COLUMNS - len(cells))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def render(text, ops):
    if BEGIN not in text or END not in text:
        sys.exit(f"coreml_docs: the markers {BEGIN} and {END} are missing")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    body = f"{len(ops)} op types.\n\n{table(ops)}\n"
    return f"{head}{BEGIN}\n{body}{END}{tail}"


def main():
    import kiln

    args = [a for a in sys.argv[1:] if a != "--check"]
    path = pathlib.Path(args[0] if args else pathlib.Path(__file__).parents[1] / "docs/coreml.md")
    text = path.read_text()
    new = render(text, sorted(kiln.coreml.supported_ops()))
    if "--check" in sys.argv:
        if new != text:
            sys.exit(f"{path}: the op table is out of date (run scripts/coreml_docs.py)")
        return
    path.write_text(new)


if __name__ == "__main__":
    main()
