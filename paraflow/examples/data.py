"""Datasets for examples and benchmarks: scikit-learn's digits (real, bundled) or synthetic."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

from ..errors import ConfigurationError, MissingDependencyError

__all__ = ["DATASETS", "load_dataset"]

DATASETS = ("digits", "synthetic")


def _digits(seed: int, test_fraction: float) -> tuple[TensorDataset, TensorDataset]:
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise MissingDependencyError(
            "the digits data comes with scikit-learn, which is not installed: "
            "`pip install scikit-learn` (or `pip install paraflow[data]`), or use --data synthetic."
        ) from None
    bunch = load_digits()
    x = torch.tensor(bunch.data, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    y = torch.tensor(bunch.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = int(len(y) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test])


def _synthetic(
    seed: int, test_fraction: float, size: int, shape: tuple[int, ...], classes: int
) -> tuple[TensorDataset, TensorDataset]:
    """Gaussian images labelled by a fixed random linear teacher, so there is something to learn."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(size, *shape, generator=g)
    teacher = torch.randn(x[0].numel(), classes, generator=g)
    y = (x.flatten(1) @ teacher).argmax(dim=1)
    n_test = int(size * test_fraction)
    return TensorDataset(x[n_test:], y[n_test:]), TensorDataset(x[:n_test], y[:n_test])


def load_dataset(
    name: str,
    seed: int = 0,
    test_fraction: float = 0.2,
    size: int = 4096,
    shape: tuple[int, ...] = (1, 8, 8),
    classes: int = 10,
) -> tuple[TensorDataset, TensorDataset]:
    """Return (train, test) for `name`; identical on every rank for the same seed.

    `size`, `shape` and `classes` apply to synthetic data; digits are 1x8x8 with 10 classes.
    """
    if name == "digits":
        return _digits(seed, test_fraction)
    if name == "synthetic":
        return _synthetic(seed, test_fraction, size, tuple(shape), classes)
    raise ConfigurationError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}.")
