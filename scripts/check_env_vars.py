#!/usr/bin/env python3
"""Every environment variable kiln reads is read in one place and listed in README.md.

src/runtime/env_vars.inc is the table of the variables (KILN_ENV_VAR(name, "doc")). Fails, naming
each problem, when:
  - the library calls getenv anywhere but src/runtime/env.cpp, or the Python package reads
    os.environ;
  - a "KILN_..." string literal of the library, CLI or Python package is not in the table;
  - a variable of the table is read nowhere (env::Var::NAME in src/, or its name in tests/);
  - README.md's list, between its env-vars markers, is not the one written from the table.

    check_env_vars.py [--write] [repo root]     (--write rewrites README.md's list)
"""
import pathlib
import re
import sys

TABLE = "src/runtime/env_vars.inc"
BEGIN = "<!-- env-vars: written by scripts/check_env_vars.py --write from src/runtime/env_vars.inc -->"
END = "<!-- env-vars end -->"
SOURCES = (".h", ".cpp", ".cu", ".cuh", ".inc", ".py")


def table(root):
    text = (root / TABLE).read_text()
    text = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("//"))
    out = []
    for m in re.finditer(r"KILN_ENV_VAR\((\w+),((?:\s*\"(?:[^\"\\]|\\.)*\")+)\s*\)", text):
        doc = "".join(re.findall(r"\"((?:[^\"\\]|\\.)*)\"", m.group(2)))
        out.append((m.group(1), doc.replace("|", "\\|")))
    return out


def listing(rows):
    lines = [BEGIN, "", "| variable | what it does |", "|---|---|"]
    lines += [f"| `{n}` | {d} |" for n, d in rows]
    return "\n".join(lines + ["", END])


def files(root, folders):
    for folder in folders:
        for f in sorted((root / folder).rglob("*")):
            if f.suffix in SOURCES and f.is_file():
                yield f, f.read_text(errors="replace")


def main():
    args = [a for a in sys.argv[1:] if a != "--write"]
    write = "--write" in sys.argv[1:]
    root = pathlib.Path(args[0] if args else ".")
    rows = table(root)
    names = {n for n, _ in rows}
    problems = []

    for f, text in files(root, ("src", "python/kiln")):
        rel = str(f.relative_to(root))
        if rel != "src/runtime/env.cpp" and re.search(r"\bgetenv\s*\(|os\.environ", text):
            problems.append(f"{rel} reads the environment itself (use env::get in src/runtime/env.h)")
    for f, text in files(root, ("src", "tools", "python/kiln")):
        for n in re.findall(r"[\"'](KILN_[A-Z0-9_]+)[\"']", text):
            if n not in names:
                problems.append(f"{n} (read in {f.relative_to(root)}) is not in {TABLE}")
    used = "".join(t for _, t in files(root, ("src",)))
    tests = "".join(t for _, t in files(root, ("tests",)))
    for n in sorted(names):
        if f"Var::{n}" not in used and n not in tests:
            problems.append(f"{n} is in {TABLE} but nothing reads it")

    readme_path = root / "README.md"
    readme = readme_path.read_text()
    want = listing(rows)
    start, stop = readme.find(BEGIN), readme.find(END)
    if start < 0 or stop < start:
        problems.append("README.md has no env-vars markers")
    else:
        have = readme[start:stop + len(END)]
        if have != want:
            if write:
                readme_path.write_text(readme[:start] + want + readme[stop + len(END):])
                print("README.md: the list of environment variables is written again")
            else:
                problems.append("README.md's list of environment variables is not the table's "
                                "(scripts/check_env_vars.py --write)")
    for p in problems:
        print(p)
    print(f"environment variables: {len(rows)} in the table, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
