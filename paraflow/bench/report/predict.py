"""Each measured multi-process training row's step time, predicted from compute and the α-β fit.

predicted step = compute + the modelled time of the messages the backend sends per step, with no
overlap: on a CPU host the library's threads and the backward pass share the same cores, so
communication is taken to add to the step (the comm overhead column measures how far that holds).

compute: the row's ``compute_ms`` where the table has it, else the median step without gradient
sync that the comm overhead measurement records (forward, backward, local optimizer update).

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
"""

from __future__ import annotations

import math
import statistics
from typing import Optional

from ..driver.config import ModelSpec
from . import metrics
from .costmodel import algorithm_of, allreduce_s
from .launches import groups, rounded, task_of
from .tables_training import TASK_PREFIX

__all__ = ["DDP_FIRST_BUCKET", "DDP_BUCKET", "HOROVOD_FUSION", "messages", "comm_s", "row_facts", "predict_rows"]

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
    if backend.startswith("ddp"):
        sizes = _ddp_buckets(tensors) if tensors else _chunks(grad_bytes, DDP_FIRST_BUCKET, DDP_BUCKET)
        return [("allreduce", s) for s in sizes]
    if backend == "horovod":
        return [("allreduce", s) for s in _chunks(grad_bytes, fusion or grad_bytes, fusion or grad_bytes)]
    if backend == "fsdp":
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
    facts = row_facts(cells)
    sizes: dict = {}
    details = []
    for row in training:
        fit = by_cell.get((row["backend"], row["launcher"], row["processes"]))
        fact = facts.get((row["model"], row["scaling"], row["backend"], row["launcher"], row["processes"]))
        if row.get("setting", "default") != "default":  # a tuned row's messages differ from the defaults'
            continue
        if fit is None or fact is None or row.get("step_ms_median") is None:
            continue
        compute = row.get("compute_ms")
        source = "compute_ms" if compute is not None else "no-sync step"
        compute = compute if compute is not None else fact["no_sync_ms"]
        if compute is None:
            continue
        if fact["spec"] not in sizes:
            sizes[fact["spec"]] = _model_sizes(fact["spec"], row.get("parameters"))
        tensors, units = sizes[fact["spec"]]
        parts = messages(row["backend"], fact["grad_bytes"], tensors, units)
        bandwidth = fit["bandwidth_bps"] or math.inf
        times = comm_s(parts, fit["alpha_s"], bandwidth, row["processes"], fit["algorithm"], fit.get("fixed_s", 0.0))
        predicted = compute + sum(times) * 1e3
        if row["backend"] == "fsdp":  # its no-sync step still all-gathers: those are in the measured compute
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
            }
        )
    return details
