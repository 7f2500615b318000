"""Datasets for examples and benchmarks: scikit-learn's digits (real, bundled) or synthetic."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from ..environment.cache import cache_dir
from ..errors import ConfigurationError, MissingDependencyError

__all__ = ["DATASETS", "load_dataset"]

DATASETS = ("digits", "synthetic")
_DIGITS = 1797  # images in scikit-learn's digits


def digits_cache_path() -> Path:
    """Where the digits are kept after the first load: $XDG_CACHE_HOME/paraflow, else ~/.cache/paraflow."""
    return cache_dir() / "digits.pt"


def _digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's digits as (uint8 pixels 0-16, labels), read from the cache when it holds them:
    importing scikit-learn takes longer than a short training run on them."""
    path = digits_cache_path()
    try:
        pixels, labels = torch.load(path, weights_only=True)
        if pixels.shape == (_DIGITS, 64) and pixels.dtype == torch.uint8 and labels.shape == (_DIGITS,):
            return pixels, labels
    except Exception:  # missing, unreadable or damaged: load them again
        pass
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise MissingDependencyError(
            "the digits data comes with scikit-learn, which is not installed: "
            "`pip install scikit-learn` (or `pip install paraflow[data]`), or use --data synthetic."
        ) from None
    bunch = load_digits()
    pixels = torch.tensor(bunch.data, dtype=torch.uint8)
    labels = torch.tensor(bunch.target, dtype=torch.long)
    # Several ranks may write at once: each writes its own file, and the rename is atomic.
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save((pixels, labels), partial)
        os.replace(partial, path)
    except (OSError, RuntimeError):  # a read-only home or a full disk (torch.save's writer): no cache
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
    return pixels, labels


def _digits(seed: int, test_fraction: float) -> tuple[TensorDataset, TensorDataset]:
    pixels, y = _digits_tensors()
    x = pixels.to(torch.float32).reshape(-1, 1, 8, 8) / 16.0
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
