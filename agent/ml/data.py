"""The digits data set (1,797 8x8 images of 10 digits), from the copy scikit-learn ships."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

Features = NDArray[np.float64]
Labels = NDArray[np.int64]

DIGITS_CSV = Path("datasets") / "data" / "digits.csv.gz"
PIXEL_MAX = 16.0  # the digits' pixels are counts 0..16
TEST_FRACTION = 0.2
SPLIT_SEED = 1_797


def shipped_csv() -> Path | None:
    """Where the installed scikit-learn keeps its digits CSV, found without importing it."""
    # find_spec on a top-level package locates it without running its __init__: importing
    # scikit-learn costs about 1.5 s and 100 MB per job process, and only this file is needed.
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / DIGITS_CSV
    return path if path.is_file() else None


def _from_sklearn() -> NDArray[np.float64]:
    # The slow, official path, for a scikit-learn whose file layout has changed.
    from sklearn.datasets import load_digits  # type: ignore[import-untyped]

    x, y = load_digits(return_X_y=True)
    return np.column_stack([np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)])


def digits() -> tuple[Features, Labels]:
    """(pixels scaled to 0..1, labels 0..9) of every digit, in the order scikit-learn has."""
    path = shipped_csv()
    if path is None:
        raw = _from_sklearn()
    else:
        with gzip.open(path) as stream:
            raw = np.loadtxt(stream, delimiter=",", dtype=np.float64)
    features = raw[:, :-1] / PIXEL_MAX
    labels = raw[:, -1].astype(np.int64)
    return features, labels


def split(
    features: Features,
    labels: Labels,
    test_fraction: float = TEST_FRACTION,
    seed: int = SPLIT_SEED,
) -> tuple[Features, Labels, Features, Labels]:
    """(train x, train y, test x, test y): one fixed shuffle, so every job holds out the same."""
    order = np.random.default_rng(seed).permutation(len(labels))
    cut = len(labels) - round(len(labels) * test_fraction)
    train, test = order[:cut], order[cut:]
    return features[train], labels[train], features[test], labels[test]
