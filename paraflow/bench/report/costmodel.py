"""Latency α and bandwidth B of each library's allreduce, fitted to the collective sweep.

An allreduce of S bytes over n ranks takes T = a(n)·α + b(n)·S/B, with the coefficients of the
algorithm the library runs for the sweep's sizes:

- ring, a = 2(n−1), b = 2(n−1)/n: gloo's ``allreduce`` when no algorithm is set, which is how
  torch's ProcessGroupGloo calls it for dense CPU tensors (DDP and fsdp on CPU) and how horovod's
  gloo operations call it (``horovodrun --gloo``); NCCL's ring likewise.
- rabenseifner, a = 2·log2(n), b = 2(n−1)/n: Open MPI's tuned allreduce (horovod under mpirun)
  takes recursive halving then doubling for large commutative reductions; its bandwidth term is
  the ring's and at n = 2 its latency term too, so at 2 ranks both fits are the same numbers.
- half, a = n−1, b = (n−1)/n: one reduce-scatter or one all-gather, half of a ring allreduce
  (how fsdp's collectives are modelled from the allreduce fit).

Horovod adds a fixed wait per operation: its background thread runs one cycle per
``HOROVOD_CYCLE_TIME`` (1 ms by default) and an operation starts at the next cycle; the sweep's
small horovod allreduces took that millisecond and no less. That cycle is taken as known and
subtracted before the fit (``fixed``), so α stays the per-step latency that grows with n.

The fit is weighted least squares on relative error (weights 1/T², so 4 KB counts as much as
64 MB), α and 1/B held non-negative; residuals are reported per size.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ...errors import ConfigurationError

__all__ = [
    "HOROVOD_CYCLE_S",
    "fixed_s",
    "ALGORITHMS",
    "algorithm_of",
    "coefficients",
    "fit_alpha_beta",
    "allreduce_s",
    "fit_sweep",
    "FIT_COLUMNS",
]

HOROVOD_CYCLE_S = 1e-3  # HOROVOD_CYCLE_TIME's default since horovod 0.21

ALGORITHMS = {
    "ring": "2(n-1)·α + 2(n-1)/n·S/B",
    "rabenseifner": "2·log2(n)·α + 2(n-1)/n·S/B",
    "half": "(n-1)·α + (n-1)/n·S/B",
}

FIT_COLUMNS = {
    "backend": "backend",
    "launcher": "launcher",
    "transport": "transport",
    "link": "link",
    "processes": "procs",
    "algorithm": "algorithm",
    "fixed_us": "fixed (µs)",
    "alpha_us": "α (µs)",
    "bandwidth_gbs": "B (GB/s)",
    "sizes": "sizes",
    "rms_residual": "rms residual",
    "max_residual": "max |residual|",
    "status": "status",
}


def algorithm_of(backend: str, transport: Optional[str]) -> str:
    """The allreduce algorithm `backend` runs over `transport` (see the module docstring)."""
    if backend == "horovod" and transport == "mpi":
        return "rabenseifner"
    return "ring"


def fixed_s(backend: str) -> float:
    """Seconds every operation of `backend` waits whatever its size: horovod's cycle, 0 for the others."""
    return HOROVOD_CYCLE_S if backend == "horovod" else 0.0


def coefficients(algorithm: str, n: int) -> tuple[float, float]:
    """(latency steps a, bytes factor b) of `algorithm` on `n` ranks."""
    if n < 2:
        return 0.0, 0.0
    if algorithm == "ring":
        return 2.0 * (n - 1), 2.0 * (n - 1) / n
    if algorithm == "rabenseifner":
        return 2.0 * math.log2(n), 2.0 * (n - 1) / n
    if algorithm == "half":
        return float(n - 1), (n - 1) / n
    raise ConfigurationError(f"unknown allreduce algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}.")


def allreduce_s(alpha: float, bandwidth: float, size: float, n: int, algorithm: str = "ring") -> float:
    """Modelled seconds of one collective of `size` bytes on `n` ranks (`bandwidth` in bytes/s)."""
    a, b = coefficients(algorithm, n)
    return a * alpha + b * size / bandwidth


def _solve(design: torch.Tensor, target: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Least squares for one or two unknowns with rows scaled by `weights` (1/T: each residual
    relative to its time). Plain float64 arithmetic on the normal equations of the columns scaled
    to unit length: the same bits whatever torch's thread count (LAPACK's lstsq differs in the last
    bits between 1 and 2 threads, and tables rebuilt from results.json must match)."""
    columns = list(zip(*(design * weights[:, None]).tolist()))
    y = (target * weights).tolist()
    scales = [math.sqrt(math.fsum(v * v for v in column)) or 1.0 for column in columns]
    columns = [[v / scale for v in column] for column, scale in zip(columns, scales)]
    gram = [[math.fsum(a * b for a, b in zip(ci, cj)) for cj in columns] for ci in columns]
    right = [math.fsum(a * b for a, b in zip(column, y)) for column in columns]
    if len(columns) == 1:
        solution = [right[0] / gram[0][0]]
    else:
        det = gram[0][0] * gram[1][1] - gram[0][1] * gram[1][0]
        solution = [
            (right[0] * gram[1][1] - gram[0][1] * right[1]) / det,
            (gram[0][0] * right[1] - gram[1][0] * right[0]) / det,
        ]
    return torch.tensor([p / scale for p, scale in zip(solution, scales)], dtype=torch.float64)


def fit_alpha_beta(
    sizes: list, times: list, n: int, algorithm: str = "ring", fixed: float = 0.0
) -> tuple[float, float]:
    """(α seconds, B bytes/s) of `algorithm` on `n` ranks from allreduce `times` (s) at `sizes` (bytes),
    each time being `fixed` + a(n)·α + b(n)·S/B.

    Needs at least two distinct sizes and positive times; a negative α is clamped to 0 and B refitted.
    """
    if n < 2:
        raise ConfigurationError(f"an allreduce fit needs 2 or more ranks, got n={n}.")
    if len(set(sizes)) < 2 or len(sizes) != len(times) or any(t <= 0 for t in times):
        raise ConfigurationError(
            f"an α-β fit needs positive times at two or more sizes, got sizes={sizes} times={times}; "
            "run the sweep with --min-bytes below --max-bytes."
        )
    a, b = coefficients(algorithm, n)
    s = torch.tensor(sizes, dtype=torch.float64)
    t = torch.tensor(times, dtype=torch.float64)
    design = torch.stack([torch.full_like(s, a), b * s], dim=1)
    weights = 1.0 / t
    alpha, inverse = _solve(design, t - fixed, weights).tolist()
    if alpha < 0:
        alpha, inverse = 0.0, _solve(design[:, 1:], t - fixed, weights).item()
    if inverse <= 0:  # times do not grow with size: latency alone, bandwidth unresolved (infinite)
        return max(0.0, _solve(design[:, :1], t - fixed, weights).item()), math.inf
    return alpha, 1.0 / inverse


def _link(header: Optional[dict]) -> str:
    cluster = (header or {}).get("cluster")
    return f"{cluster['hosts']} hosts, {cluster['bandwidth']}" if cluster else "one host"


def fit_sweep(sweep: list, header: Optional[dict] = None) -> list:
    """One fit per backend, launcher and process count from the sweep table's float32 allreduce rows.

    Uses the raw library's time (what training sends goes through the library's own call), the
    paraflow call's where the raw one is missing.
    """
    grouped: dict = {}
    for row in sweep:
        if row.get("collective") != "allreduce" or row.get("dtype") != "float32" or row.get("size_bytes") is None:
            continue
        if not str(row.get("status", "")).startswith("ok"):
            continue
        key = (row["backend"], row["launcher"], row["transport"], row["processes"])
        time_us = row.get("raw_time_us") if row.get("raw_time_us") is not None else row.get("time_us")
        if time_us:
            grouped.setdefault(key, []).append((row["size_bytes"], time_us * 1e-6))
    fits = []
    for (backend, launcher, transport, n), points in grouped.items():
        algorithm, fixed = algorithm_of(backend, transport), fixed_s(backend)
        fit = dict.fromkeys(FIT_COLUMNS)
        fit.update(backend=backend, launcher=launcher, transport=transport, link=_link(header), processes=n)
        fit.update(algorithm=algorithm, sizes=len(points))
        try:
            alpha, bandwidth = fit_alpha_beta([p[0] for p in points], [p[1] for p in points], n, algorithm, fixed)
        except ConfigurationError as exc:
            fit["status"] = f"no fit: {exc}"
            fits.append(fit)
            continue
        residuals = [(fixed + allreduce_s(alpha, bandwidth, s, n, algorithm)) / t - 1 for s, t in points]
        fit.update(
            fixed_us=round(fixed * 1e6, 2),
            alpha_us=round(alpha * 1e6, 2),
            bandwidth_gbs=round(bandwidth * 1e-9, 4) if math.isfinite(bandwidth) else None,
            rms_residual=round(math.sqrt(sum(r * r for r in residuals) / len(residuals)), 4),
            max_residual=round(max(abs(r) for r in residuals), 4),
            status="ok" if math.isfinite(bandwidth) else "ok (times do not grow with size: B unresolved)",
        )
        fit["fixed_s"], fit["alpha_s"] = fixed, alpha  # full precision, for the model (None: infinite)
        fit["bandwidth_bps"] = bandwidth if math.isfinite(bandwidth) else None
        fit["residuals"] = [
            {"size_bytes": s, "measured_us": round(t * 1e6, 2), "residual": round(r, 4)}
            for (s, t), r in zip(points, residuals)
        ]
        fits.append(fit)
    return fits
