"""docs/coreml.md's table of NeuralNetwork layer types is the importer's: scripts/coreml_docs.py
writes it from kiln.coreml.supported_layers() (the importer's own layer table), and a layer
mapped or dropped without rerunning the script fails here. The names are the specification's
(the fields of NeuralNetworkLayer's `layer` oneof), and the layers the doc says are not mapped
are not in the table. (The MIL op table's check is in test_coreml.py.)"""
import importlib.util
import pathlib
import re
import warnings

import pytest

import kiln

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "coreml.md"

pytestmark = pytest.mark.skipif(not kiln.coreml.available(),
                                reason="kiln built without Core ML import")


def coreml_docs():
    spec = importlib.util.spec_from_file_location("coreml_docs",
                                                  ROOT / "scripts" / "coreml_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_supported_layers_are_the_specifications_layer_fields():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from coremltools.proto import NeuralNetwork_pb2

    layers = kiln.coreml.supported_layers()
    assert layers == sorted(set(layers))
    assert {"convolution", "innerProduct", "activation", "batchedMatmul", "reduceLogSum"} <= set(
        layers)
    oneof = NeuralNetwork_pb2.NeuralNetworkLayer.DESCRIPTOR.oneofs_by_name["layer"]
    fields = {f.name for f in oneof.fields}
    assert not set(layers) - fields, f"not layer fields: {sorted(set(layers) - fields)}"


def test_docs_layer_table_is_current():
    text = DOCS.read_text()
    layers = sorted(kiln.coreml.supported_layers())
    assert coreml_docs().render_layers(text, layers) == text, (
        "docs/coreml.md's NeuralNetwork layer table is out of date: run scripts/coreml_docs.py")
    table = text.split("<!-- layers -->", 1)[1].split("<!-- /layers -->", 1)[0]
    assert sorted(re.findall(r"`(\w+)`", table)) == layers
    assert f"{len(layers)} layer types." in table


def test_a_stale_layer_table_is_found():
    docs = coreml_docs()
    text = DOCS.read_text()
    layers = sorted(kiln.coreml.supported_layers())
    assert docs.render_layers(text, layers[1:]) != text
    assert docs.render_layers(text, layers + ["sequenceRepeat"]) != text
    # the MIL op table is left alone
    assert docs.render_layers(text, layers[1:]).split("<!-- ops -->")[1] == text.split(
        "<!-- ops -->")[1]


def test_layers_the_docs_call_unmapped_are_not_supported():
    text = DOCS.read_text()
    bullet = text.split("## What is not read (yet)", 1)[1].split("\n- ", 2)[1]
    unmapped = set(re.findall(r"`(\w+)`", bullet))
    assert {"custom", "branch", "loop", "dot"} <= unmapped
    assert not unmapped & set(kiln.coreml.supported_layers())
