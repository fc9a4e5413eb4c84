#!/usr/bin/env python3
"""Writes the Core ML specification's protobuf schema as a FileDescriptorSet, for
`protoc --descriptor_set_in=... --cpp_out=...` (src/io/coreml/CMakeLists fragment in the top
CMakeLists.txt).

The coremltools package (PyPI) ships no .proto files; its generated *_pb2.py modules each carry
their file's serialized FileDescriptorProto (the argument of AddSerializedFile). They are read as
text, not imported (importing coremltools loads much more), and each one becomes a `file` entry
of the set: field 1, length-delimited, so the set is their tagged concatenation.

    coreml_descriptors.py OUT.pb [--list]   (--list: print the .proto names, one a line)
"""
import ast
import importlib.util
import pathlib
import sys


def proto_dir():
    spec = importlib.util.find_spec("coremltools")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("coreml_descriptors: the coremltools package is not installed "
                 "(scripts/setup.sh installs it into .venv)")
    d = pathlib.Path(list(spec.submodule_search_locations)[0]) / "proto"
    if not d.is_dir():
        sys.exit(f"coreml_descriptors: coremltools has no proto package ({d})")
    return d


def literal_bytes(node):
    """A bytes literal, or an older generator's _b('...') (a str of code points below 256)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, bytes):
        return node.value
    if (isinstance(node, ast.Call) and len(node.args) == 1
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return node.args[0].value.encode("latin-1")
    return None


def serialized_file(path):
    """The serialized FileDescriptorProto of one generated module: the argument of
    AddSerializedFile, or an older module's FileDescriptor(serialized_pb=...)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        if node.func.attr == "AddSerializedFile" and node.args:
            blob = literal_bytes(node.args[0])
        elif node.func.attr == "FileDescriptor":
            blob = next((literal_bytes(k.value) for k in node.keywords
                         if k.arg == "serialized_pb"), None)
        else:
            continue
        if blob is not None:
            return blob
    return None


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def proto_name(blob):
    """FileDescriptorProto.name (field 1, the first field the generator writes)."""
    if not blob or blob[0] != 0x0A:
        return None
    n, shift, i = 0, 0, 1
    while True:
        b = blob[i]
        n |= (b & 0x7F) << shift
        shift += 7
        i += 1
        if not b & 0x80:
            break
    return blob[i:i + n].decode("utf-8")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    files = []
    for path in sorted(proto_dir().glob("*_pb2.py")):
        blob = serialized_file(path)
        if blob is None:
            sys.exit(f"coreml_descriptors: no serialized descriptor in {path.name}")
        files.append((proto_name(blob), blob))
    if not any(name == "Model.proto" for name, _ in files):
        sys.exit("coreml_descriptors: Model.proto is not among coremltools' descriptors")
    out = b"".join(b"\x0a" + varint(len(blob)) + blob for _, blob in files)
    target = pathlib.Path(sys.argv[1])
    if not target.exists() or target.read_bytes() != out:  # (unchanged: no rebuild)
        target.write_bytes(out)
    if "--list" in sys.argv[2:]:
        print("\n".join(name for name, _ in files))


if __name__ == "__main__":
    main()
