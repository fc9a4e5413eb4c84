"""The `kiln` command of an installed wheel: runs the CLI program the wheel carries (kiln/bin)."""
import os
import sys
from pathlib import Path


def main():
    exe = Path(__file__).resolve().parent / "bin" / "kiln"
    if not exe.is_file():
        sys.exit(f"kiln: the command-line program is not in this installation ({exe}); "
                 "build it from source with `make build`")
    os.execv(exe, [str(exe)] + sys.argv[1:])


if __name__ == "__main__":
    main()
