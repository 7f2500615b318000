"""A projection, not a measurement: step time, samples/s and weak-scaling efficiency at many hosts.

Each measured multi-process row (its compute time and the messages its backend sends, from
predict.py) is carried to N hosts, one rank per host, with its backend's fitted form
(costmodel.py): the fitted latency α, and as bandwidth either the fitted one ("as fitted") or a
stated link's rate times TCP's payload share (1448 of every 1514 bytes on the wire). No overlap of
communication with compute, as in the predictions; efficiency = compute / projected step (the step
without communication as the one-rank baseline), samples/s = N × batch per rank / step.

:func:`published_comparison` holds the same form against Horovod's published weak scaling on 512
GPUs (128 servers × 4 Pascal GPUs, 25 Gbit/s RoCE): 90 % for Inception V3 and ResNet-101, 68 % for
VGG-16, at batch 64 per GPU. Compute per step = 64 / the model's single-P100 throughput in
TensorFlow's tf_cnn_benchmarks (DGX-1, synthetic data, batch 64: Inception V3 142 images/s, VGG-16
154; ResNet-101 is not in that table and is interpolated by its FLOPs between ResNet-50, 219, and
ResNet-152, 91.8: 129). The gradient is one flat ring over all 512 GPUs (NCCL, as Horovod ran then)
whose slowest hop is each server's 25 Gbit/s link, fused in buffers of 64 MiB (the fusion
threshold's default then) after one 5 ms cycle (the cycle time's default then), with a stated α per
ring step. Two bounds: no overlap, and overlap with
the backward pass (2/3 of compute) of everything but the last fused buffer.
"""

from __future__ import annotations

import math
from typing import Optional

from .costmodel import allreduce_s
from .launches import rounded
from .predict import comm_s, messages

__all__ = ["HOSTS", "LINKS_GBIT", "PAYLOAD_SHARE", "PUBLISHED", "project", "published_comparison", "exposed_s"]

HOSTS = (8, 32, 128)
LINKS_GBIT = (10, 100)
PAYLOAD_SHARE = 1448 / 1514  # TCP payload per Ethernet frame
BACKWARD_SHARE = 2 / 3  # backward ≈ twice forward's FLOPs

#: model -> (parameters, single-P100 images/s at batch 64, Horovod's published efficiency on 512 GPUs)
PUBLISHED = {
    "Inception V3": (23_800_000, 142.0, 0.90),
    "ResNet-101": (44_500_000, 129.0, 0.90),
    "VGG-16": (138_000_000, 154.0, 0.68),
}


def exposed_s(times: list, compute_s: float, hidden_share: float) -> float:
    """Communication the step waits for: all of it with no overlap (`hidden_share` 0), else what
    exceeds `hidden_share` of compute, and never less than the last message."""
    total = sum(times)
    if hidden_share <= 0 or not times:
        return total
    return max(total - hidden_share * compute_s, times[-1])


def _link_bandwidth(gbit: float) -> float:
    return gbit * 1e9 / 8 * PAYLOAD_SHARE


def project(details: list, hosts: tuple = HOSTS, links: tuple = LINKS_GBIT) -> list:
    """Rows per measured row (weak scaling) x link x host count; the measured point first."""
    rows = []
    for d in details:
        if d["scaling"] != "weak":
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


def published_comparison(
    alpha_s: float = 10e-6,
    link_gbit: float = 25.0,
    servers: int = 128,
    gpus_per_server: int = 4,
    batch: int = 64,
    fusion_bytes: int = 64 * 1024 * 1024,
    cycle_s: float = 5e-3,
    payload_share: Optional[float] = None,
) -> list:
    """Projected against Horovod's published 512-GPU efficiencies, one row per model (see the module
    docstring for every assumption); efficiencies with no overlap and with backward overlap."""
    n = servers * gpus_per_server
    bandwidth = link_gbit * 1e9 / 8 * (PAYLOAD_SHARE if payload_share is None else payload_share)
    rows = []
    for model, (parameters, images_per_s, published) in PUBLISHED.items():
        grad = parameters * 4
        compute = batch / images_per_s
        parts = messages("horovod", grad, fusion=fusion_bytes)
        times = [allreduce_s(alpha_s, bandwidth, size, n, "ring") for _, size in parts]
        times[0] += cycle_s  # one cycle of horovod's background thread before the first buffer goes out
        plain = compute / (compute + exposed_s(times, compute, 0))
        overlapped = compute / (compute + exposed_s(times, compute, BACKWARD_SHARE))
        rows.append(
            {
                "model": model,
                "parameters": parameters,
                "grad_mb": rounded(grad / 1e6, 1),
                "messages": len(parts),
                "compute_ms": rounded(compute * 1e3, 1),
                "comm_ms": rounded(sum(times) * 1e3, 1),
                "latency_ms": rounded((len(parts) * 2 * (n - 1) * alpha_s + cycle_s) * 1e3, 1),
                "efficiency_no_overlap": rounded(plain, 3),
                "efficiency_overlap": rounded(overlapped, 3),
                "published": published,
                "gpus": n,
                "link": f"{link_gbit:g} Gbit/s",
                "alpha_us": rounded(alpha_s * 1e6, 2),
            }
        )
    return rows
