"""Benchmarks: the same training loop under every backend and launcher, compared honestly.

    from paraflow.bench import BenchConfig, run_bench
    results = run_bench(BenchConfig(nprocs=[1, 2], models=["mlp", "cnn"]))

or from a shell: ``paraflow bench`` (``make bench``). Optional dependencies (tabulate,
matplotlib) are imported only when a run starts.
"""

from __future__ import annotations

from .driver.config import BenchConfig, message_sizes, parse_size
from .driver.matrix import Cell, build_matrix
from .driver.run import run_bench
from .model_spec import ModelSpec
from .report.tables import build_tables

__all__ = [
    "BenchConfig",
    "ModelSpec",
    "Cell",
    "build_matrix",
    "run_bench",
    "build_tables",
    "message_sizes",
    "parse_size",
]
