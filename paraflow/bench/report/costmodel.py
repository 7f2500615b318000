"""The cost model: α-β fits of each library's allreduce, predicted step times, a projection to many hosts.

Computation only, on numbers the run already measured (the collective sweep, the training rows
and their no-sync steps): built with every run, and again by ``paraflow bench project DIR``
from a results folder.

The fit
-------

Latency α and bandwidth B of each library's allreduce, fitted to the collective sweep.

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

The prediction
--------------

Each measured multi-process training row's step time, predicted from compute and the α-β fit.

predicted step = compute + the modelled time of the messages the backend sends per step, with no
overlap: on a CPU host the library's threads and the backward pass share the same cores, so
communication is taken to add to the step (the comm overhead column measures how far that holds).

compute: the median step without gradient sync that the comm overhead measurement records
(forward, backward, local optimizer update).

Messages per step, from the model's own parameter tensors where the model can be rebuilt from its
spec (else from the gradient bytes alone):

- DDP: its gradient buckets as torch forms them after the first iteration's rebuild (gradients in
  the order backward produces them, about the reverse of the parameters; ``bucket_cap_mb`` 25 MiB,
  the first bucket 1 MiB), one allreduce each (``torch.distributed._compute_bucket_assignment_by_size``);
- horovod: the gradients fused into buffers of up to the fusion threshold (128 MiB), one
  allreduce each;
- fsdp: per sharded unit (the blocks fsdp chooses, then the root), an all-gather before forward,
  another before backward (not for the root, which keeps its parameters) and a reduce-scatter of
  its gradients, each modelled as half a ring allreduce. fsdp's step without gradient sync still
  all-gathers, so its compute is that step minus the modelled all-gathers (the prediction at the
  measured n then adds only the reduce-scatters; the projection all three).

The projection
--------------

A projection, not a measurement: step time, samples/s and weak-scaling efficiency at many hosts.

Each measured multi-process row (its compute time and the messages its backend sends, from
the prediction above) is carried to N hosts, one rank per host, with its backend's fitted form
(the fit above): the fitted latency α, and as bandwidth either the fitted one ("as fitted") or a
stated link's rate times TCP's payload share (1448 of every 1514 bytes on the wire). No overlap of
communication with compute, as in the predictions; efficiency = compute / projected step (the step
without communication as the one-rank baseline), samples/s = N × batch per rank / step.

paraflow bench project
----------------------

``paraflow bench project DIR``: the cost model from a results folder, running nothing.

Rebuilds every table from the folder's raw numbers (so an older run gets the model too), prints
the fits, the predictions and the projection, and writes ``projection.json``, ``costmodel.csv``
and ``projection.csv`` into the folder.
"""

from __future__ import annotations

import math
import statistics
from typing import Optional

import numpy as np

from ...errors import ConfigurationError
from ..backends import facts
from ..model_spec import ModelSpec
from . import metrics
from .launches import TASK_PREFIX, groups, rounded, task_of

__all__ = ["fit_sweep", "predict_rows", "project", "model_tables", "KEYS"]
__all__ += ["FIT_COLUMNS", "PROJECTION_COLUMNS", "PREDICTION_COLUMNS"]

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
    """The allreduce algorithm `backend` runs over `transport` (paraflow.bench.backends; see the module docstring)."""
    known = facts(backend)
    return known.algorithms.get(transport or "", "ring") if known else "ring"


def fixed_s(backend: str) -> float:
    """Seconds every operation of `backend` waits whatever its size: horovod's cycle, 0 for the others."""
    known = facts(backend)
    return known.fixed_s if known else 0.0


def no_model_reason(backend: str) -> Optional[str]:
    """Why the cost model cannot predict `backend`'s step, or None when it can."""
    if facts(backend) is None:
        return f"no cost model for {backend} (paraflow.bench.backends.FACTS has no entry for it)"
    return None


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


def fit_alpha_beta(
    sizes: list, times: list, n: int, algorithm: str = "ring", fixed: float = 0.0
) -> tuple[float, float]:
    """(α seconds, B bytes/s) of `algorithm` on `n` ranks from allreduce `times` (s) at `sizes` (bytes),
    each time being `fixed` + a(n)·α + b(n)·S/B.

    Needs at least two distinct sizes and positive times. Non-negative least squares (scipy's nnls):
    where the unconstrained α would be negative it is 0 and B is fitted alone.
    """
    if n < 2:
        raise ConfigurationError(f"an allreduce fit needs 2 or more ranks, got n={n}.")
    if len(set(sizes)) < 2 or len(sizes) != len(times) or any(t <= 0 for t in times):
        raise ConfigurationError(
            f"an α-β fit needs positive times at two or more sizes, got sizes={sizes} times={times}; "
            "run the sweep with --min-bytes below --max-bytes."
        )
    from scipy.optimize import nnls

    a, b = coefficients(algorithm, n)
    rows = [[a / t, b * s / t] for s, t in zip(sizes, times)]  # each residual relative to its time
    scales = [math.hypot(*column) for column in zip(*rows)]  # columns of unit length: well conditioned
    design = np.array([[v / scale for v, scale in zip(row, scales)] for row in rows])
    solution, _ = nnls(design, np.array([(t - fixed) / t for t in times]))
    alpha, inverse = (float(x) / scale for x, scale in zip(solution, scales))
    # times that do not grow with size: latency alone, bandwidth unresolved (infinite)
    return alpha, 1.0 / inverse if inverse > 0 else math.inf


def fit_sweep(sweep: list, header: Optional[dict] = None) -> list:
    """One fit per backend, launcher and process count from the sweep table's float32 allreduce rows
    (the library's own call, which training sends its gradients through)."""
    grouped: dict = {}
    for row in sweep:
        if row.get("collective") != "allreduce" or row.get("size_bytes") is None:
            continue
        if not str(row.get("status", "")).startswith("ok"):
            continue
        key = (row["backend"], row["launcher"], row["transport"], row["processes"])
        if row.get("time_us"):
            grouped.setdefault(key, []).append((row["size_bytes"], row["time_us"] * 1e-6))
    cluster = (header or {}).get("cluster")
    link = f"{cluster['hosts']} hosts, {cluster['bandwidth']}" if cluster else "one host"
    fits = []
    for (backend, launcher, transport, n), points in grouped.items():
        algorithm, fixed = algorithm_of(backend, transport), fixed_s(backend)
        fit = dict.fromkeys(FIT_COLUMNS)
        fit.update(backend=backend, launcher=launcher, transport=transport, link=link, processes=n)
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


DDP_FIRST_BUCKET = 1024 * 1024  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
DDP_BUCKET = 25 * 1024 * 1024  # bucket_cap_mb=25
HOROVOD_FUSION = 128 * 1024 * 1024  # HOROVOD_FUSION_THRESHOLD's default since horovod 0.21


def _chunks(total: int, first: int, rest: int) -> list:
    out, left, cap = [], total, first
    while left > 0:
        out.append(min(left, cap))
        left -= out[-1]
        cap = rest
    return out


def _ddp_buckets(tensor_bytes: list) -> list:
    import torch
    import torch.distributed as dist

    tensors = [torch.empty(b // 4, device="meta") for b in reversed(tensor_bytes)]  # float32 gradients
    buckets, _ = dist._compute_bucket_assignment_by_size(tensors, [DDP_FIRST_BUCKET, DDP_BUCKET])
    return [sum(tensors[i].numel() * 4 for i in bucket) for bucket in buckets]


def messages(
    backend: str,
    grad_bytes: int,
    tensors: Optional[list] = None,
    units: Optional[list] = None,
    fusion: int = HOROVOD_FUSION,
) -> list:
    """[(collective, bytes)] one rank sends per step under `backend` for `grad_bytes` of gradients.

    `tensors`: the parameters' byte sizes in the model's order (DDP buckets them as torch does);
    `units`: fsdp's sharded units' byte sizes, blocks first, the root last.
    """
    known = facts(backend)
    if known is None:
        raise ConfigurationError(no_model_reason(backend))
    if known.messages == "buckets":
        sizes = _ddp_buckets(tensors) if tensors else _chunks(grad_bytes, DDP_FIRST_BUCKET, DDP_BUCKET)
        return [("allreduce", s) for s in sizes]
    if known.messages == "fused":
        return [("allreduce", s) for s in _chunks(grad_bytes, fusion or grad_bytes, fusion or grad_bytes)]
    if known.messages == "sharded":
        units = units or [grad_bytes]
        out = [("allgather", u) for u in units]  # forward
        out += [("allgather", u) for u in units[:-1]]  # backward, the root keeps its parameters
        return out + [("reduce_scatter", u) for u in units]
    return []


def comm_s(parts: list, alpha: float, bandwidth: float, n: int, algorithm: str, fixed: float = 0.0) -> list:
    """Modelled seconds of each message on `n` ranks: allreduces by `algorithm`, the rest as half a
    ring, each plus `fixed` (horovod's cycle)."""
    return [
        fixed + allreduce_s(alpha, bandwidth, size, n, algorithm if kind == "allreduce" else "half")
        for kind, size in parts
    ]


def _model_sizes(spec: str, parameters: Optional[int]) -> tuple:
    """(parameter byte sizes in order, fsdp unit byte sizes) of `spec` rebuilt (as each rank built it);
    (None, None) when it cannot be rebuilt with the row's parameter count."""
    from ...backends.fsdp.wrap import DEFAULT_MIN_BLOCK_PARAMS, choose_blocks
    from ...examples.models import build_model

    model_spec = ModelSpec.parse(spec)
    if model_spec.kind != "builtin":
        return None, None  # your model is not rebuilt here: the prediction uses its gradient bytes
    model = build_model(model_spec.name, **model_spec.kwargs)
    params = [p for p in model.parameters() if p.requires_grad]
    if parameters is not None and sum(p.numel() for p in params) != parameters:
        return None, None  # other input shape than the default: fall back to the gradient bytes
    units, taken = [], set()
    for block in choose_blocks(model, None, DEFAULT_MIN_BLOCK_PARAMS):
        free = [p for p in block.parameters() if id(p) not in taken]
        taken.update(id(p) for p in free)
        units.append(sum(p.numel() * p.element_size() for p in free))
    units.append(sum(p.numel() * p.element_size() for p in params if id(p) not in taken))
    return [p.numel() * p.element_size() for p in params], [u for u in units if u] or None


def row_facts(cells: list) -> dict:
    """(model label, scaling, backend, launcher, processes) -> spec, gradient bytes and the median
    no-sync step (ms) of that training cell, from the raw per-rank records."""
    facts = {}
    for launches in groups(cells, "train").values():
        first = launches[0]
        for spec in first["models"]:
            for scaling, prefix in TASK_PREFIX.items():
                found = [t for c in launches for t in [task_of(c, f"{prefix}/{spec}")] if t is not None]
                if not found:
                    continue
                no_sync = [
                    statistics.median(metrics.slowest_rank_per_step([t["no_sync_step_s"] for t in tasks]))
                    for tasks in found
                    if all(t.get("no_sync_step_s") for t in tasks)
                ]
                key = (found[0][0]["model"], scaling, first["backend"], first["launcher"], first["nproc"])
                facts[key] = {
                    "spec": spec,
                    "grad_bytes": found[0][0]["grad_bytes"],
                    "no_sync_ms": statistics.median(no_sync) * 1e3 if no_sync else None,
                }
    return facts


def predict_rows(training: list, fits: list, cells: list) -> list:
    """Add ``predicted_step_ms`` and ``prediction_error`` (predicted / measured − 1) to every
    multi-process row with a fit and a compute time; returns what each prediction used."""
    by_cell = {(f["backend"], f["launcher"], f["processes"]): f for f in fits if f["status"].startswith("ok")}
    measured = row_facts(cells)
    sizes: dict = {}
    details = []
    for row in training:
        fit = by_cell.get((row["backend"], row["launcher"], row["processes"]))
        fact = measured.get((row["model"], row["scaling"], row["backend"], row["launcher"], row["processes"]))
        if fit is None or fact is None or row.get("step_ms_median") is None:
            continue
        unknown = no_model_reason(row["backend"])
        if unknown is not None:  # said in its own row: a silent zero would read as free communication
            details.append({k: row.get(k) for k in ("model", "scaling", "backend", "launcher", "processes")})
            details[-1].update(link=fit["link"], measured_step_ms=row["step_ms_median"], status=unknown)
            continue
        compute, source = fact["no_sync_ms"], "no-sync step"
        if compute is None:
            continue
        if fact["spec"] not in sizes:
            sizes[fact["spec"]] = _model_sizes(fact["spec"], row.get("parameters"))
        tensors, units = sizes[fact["spec"]]
        parts = messages(row["backend"], fact["grad_bytes"], tensors, units)
        bandwidth = fit["bandwidth_bps"] or math.inf
        times = comm_s(parts, fit["alpha_s"], bandwidth, row["processes"], fit["algorithm"], fit.get("fixed_s", 0.0))
        predicted = compute + sum(times) * 1e3
        if facts(row["backend"]).no_sync_communicates:  # the all-gathers are in the measured compute
            gathered = sum(t for (kind, _), t in zip(parts, times) if kind == "allgather") * 1e3
            predicted -= gathered
            compute, source = max(compute - gathered, 0.0), f"{source} - modelled all-gathers"
        row["predicted_step_ms"] = rounded(predicted, 3)
        row["prediction_error"] = rounded(predicted / row["step_ms_median"] - 1, 4)
        details.append(
            {
                "model": row["model"],
                "scaling": row["scaling"],
                "backend": row["backend"],
                "launcher": row["launcher"],
                "processes": row["processes"],
                "link": fit["link"],
                "batch_per_rank": row.get("batch_per_rank"),
                "compute_ms": rounded(compute, 3),
                "compute_from": source,
                "messages": [[kind, size] for kind, size in parts],
                "comm_ms": rounded(sum(times) * 1e3, 3),
                "predicted_step_ms": row["predicted_step_ms"],
                "measured_step_ms": row["step_ms_median"],
                "prediction_error": row["prediction_error"],
                "scaling_efficiency": row.get("scaling_efficiency"),
                "algorithm": algorithm_of(row["backend"], row.get("transport")),
                "fixed_s": fit.get("fixed_s", 0.0),
                "alpha_s": fit["alpha_s"],
                "bandwidth_bps": fit["bandwidth_bps"],  # None: unresolved, taken as infinite
                "status": "ok",
            }
        )
    return details


HOSTS = (8, 32, 128)
LINKS_GBIT = (10, 100)
PAYLOAD_SHARE = 1448 / 1514  # TCP payload per Ethernet frame


def _link_bandwidth(gbit: float) -> float:
    return gbit * 1e9 / 8 * PAYLOAD_SHARE


def project(details: list, hosts: tuple = HOSTS, links: tuple = LINKS_GBIT) -> list:
    """Rows per measured row (weak scaling) x link x host count; the measured point first."""
    rows = []
    for d in details:
        if d["scaling"] != "weak" or d.get("status", "ok") != "ok":
            continue
        compute = d["compute_ms"] * 1e-3
        for link in ("as fitted", *links):
            bandwidth = (d["bandwidth_bps"] or math.inf) if link == "as fitted" else _link_bandwidth(link)
            label = f"as fitted ({d['link']})" if link == "as fitted" else f"{link:g} Gbit/s"
            for n in hosts:
                parts = [tuple(m) for m in d["messages"]]
                times = comm_s(parts, d["alpha_s"], bandwidth, n, d["algorithm"], d.get("fixed_s", 0.0))
                step = compute + sum(times)
                rows.append(
                    {
                        "model": d["model"],
                        "backend": d["backend"],
                        "launcher": d["launcher"],
                        "link": label,
                        "hosts": n,
                        "compute_ms": rounded(compute * 1e3, 3),
                        "comm_ms": rounded(sum(times) * 1e3, 3),
                        "step_ms": rounded(step * 1e3, 3),
                        "samples_per_s": rounded(n * (d["batch_per_rank"] or 0) / step, 1),
                        "efficiency": rounded(compute / step, 4),
                    }
                )
    return rows


PROJECTION_COLUMNS = {
    "model": "model",
    "backend": "backend",
    "launcher": "launcher",
    "link": "link",
    "hosts": "hosts",
    "compute_ms": "compute ms",
    "comm_ms": "comm ms",
    "step_ms": "step ms",
    "samples_per_s": "samples/s",
    "efficiency": "weak-scaling eff",
}
MODEL_NOTE = (
    "PROJECTION, not measurement: one rank per host, the fitted latency α of each backend, the link's rate x "
    "1448/1514 (TCP payload) as bandwidth (or the fitted one), no overlap of communication with compute; "
    "efficiency = compute / projected step. Forms: " + "; ".join(f"{k}: {v}" for k, v in ALGORITHMS.items()) + "."
)


def model_tables(cells: list, training: list, sweep: list, header: Optional[dict] = None) -> dict:
    """costmodel_fit, predictions (what each training row's prediction used) and projection.

    Adds predicted_step_ms and prediction_error to the multi-process rows of `training` in place.
    """
    fits = fit_sweep(sweep, header)
    details = predict_rows(training, fits, cells)
    return {
        "costmodel_fit": fits,
        "predictions": details,
        "projection": project(details),
    }


PREDICTION_COLUMNS = {
    "model": "model",
    "scaling": "scaling",
    "backend": "backend",
    "launcher": "launcher",
    "processes": "procs",
    "link": "link",
    "compute_ms": "compute ms",
    "compute_from": "compute from",
    "comm_ms": "modelled comm ms",
    "predicted_step_ms": "predicted step ms",
    "measured_step_ms": "measured step ms",
    "prediction_error": "prediction error",
    "status": "status",
}
KEYS = ("costmodel_fit", "predictions", "projection")
