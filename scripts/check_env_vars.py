#!/usr/bin/env python3
"""Every KILN_* environment variable kiln reads is documented.

Collects the "KILN_..." string literals of the library, the CLI and the Python package (src/,
tools/, python/kiln/) and fails, naming each, when one appears in neither README.md nor docs/*.md.

    check_env_vars.py [repo root]
"""
import pathlib
import re
import sys


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    read = {}
    for folder in ("src", "tools", "python/kiln"):
        for f in sorted((root / folder).rglob("*")):
            if f.suffix in (".h", ".cpp", ".cu", ".cuh", ".inc", ".py") and f.is_file():
                for name in re.findall(r"[\"'](KILN_[A-Z0-9_]+)[\"']", f.read_text(errors="replace")):
                    read.setdefault(name, str(f.relative_to(root)))
    docs = (root / "README.md").read_text()
    docs += "".join(p.read_text() for p in sorted((root / "docs").glob("*.md")))
    missing = sorted(n for n in read if not re.search(rf"\b{n}\b", docs))
    for n in missing:
        print(f"{n} (read in {read[n]}) is not documented in README.md or docs/*.md")
    print(f"environment variables: {len(read)} read, {len(read) - len(missing)} documented")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
