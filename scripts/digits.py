"""Writes the 8x8 handwritten digits that scikit-learn ships as .npy files for `kiln demo`.

usage: python scripts/digits.py OUT_DIR
Writes OUT_DIR/digits_images.npy (1797, 1, 8, 8) float32 in [0, 1] and OUT_DIR/digits_labels.npy
(1797,) int64. Does nothing when both exist.
"""
import pathlib
import sys

import numpy as np


def main() -> None:
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "build/data")
    images, labels = out / "digits_images.npy", out / "digits_labels.npy"
    if images.exists() and labels.exists():
        return
    from sklearn.datasets import load_digits  # loads the copy inside the package: no network

    digits = load_digits()
    out.mkdir(parents=True, exist_ok=True)
    x = (digits.images.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    np.save(images, x)
    np.save(labels, digits.target.astype(np.int64))
    print(f"wrote {len(x)} digits to {out}")


if __name__ == "__main__":
    main()
