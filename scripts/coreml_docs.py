#!/usr/bin/env python3
"""Writes the tables of what kiln's Core ML importer maps into docs/coreml.md, from the built
package: the MIL ops between the `<!-- ops -->` markers (kiln.coreml.supported_ops()) and the
NeuralNetwork layer types between the `<!-- layers -->` markers (kiln.coreml.supported_layers());
--check exits 1 when the file differs (python/tests/test_coreml.py checks the op table,
python/tests/test_coreml_docs.py the layer table).

    PYTHONPATH=build/python coreml_docs.py [--check] [DOCS]"""
import pathlib
import sys

OPS = ("<!-- ops -->", "<!-- /ops -->")
LAYERS = ("<!-- layers -->", "<!-- /layers -->")
COLUMNS = 5


def table(names, header="MIL op"):
    rows = ["| " + " | ".join([header] * COLUMNS) + " |", "|" + "---|" * COLUMNS]
    for k in range(0, len(names), COLUMNS):
        cells = [f"`{o}`" for o in names[k:k + COLUMNS]]
        cells += [""] * (COLUMNS - len(cells))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def replace(text, markers, body):
    """text with what lies between the markers replaced by body."""
    begin, end = markers
    if begin not in text or end not in text:
        sys.exit(f"coreml_docs: the markers {begin} and {end} are missing")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}{end}{tail}"


def render(text, ops):
    """text with the MIL op table written from ops (sorted)."""
    return replace(text, OPS, f"{len(ops)} op types.\n\n{table(ops)}\n")


def render_layers(text, layers):
    """text with the NeuralNetwork layer table written from layers (sorted)."""
    return replace(text, LAYERS, f"{len(layers)} layer types.\n\n{table(layers, 'Layer')}\n")


def main():
    import kiln

    args = [a for a in sys.argv[1:] if a != "--check"]
    path = pathlib.Path(args[0] if args else pathlib.Path(__file__).parents[1] / "docs/coreml.md")
    text = path.read_text()
    new = render(text, sorted(kiln.coreml.supported_ops()))
    new = render_layers(new, sorted(kiln.coreml.supported_layers()))
    if "--check" in sys.argv:
        if new != text:
            sys.exit(f"{path}: the op or layer table is out of date (run scripts/coreml_docs.py)")
        return
    path.write_text(new)


if __name__ == "__main__":
    main()
