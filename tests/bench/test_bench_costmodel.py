"""The cost model: the α-β fit, the per-row prediction and the projection."""

import pytest
import torch

from paraflow.bench.report.costmodel import (
    HOSTS,
    allreduce_s,
    coefficients,
    fit_alpha_beta,
    fit_sweep,
    messages,
    predict_rows,
    project,
)
from paraflow.errors import ConfigurationError

SIZES = [4096 * 4**i for i in range(8)]  # 4K .. 64M, the sweep's defaults


@pytest.mark.parametrize(
    ("algorithm", "n", "alpha", "bandwidth"), [("ring", 2, 80e-6, 1.5e9), ("rabenseifner", 8, 30e-6, 5e8)]
)
def test_the_fit_recovers_alpha_and_bandwidth_from_noisy_synthetic_timings(algorithm, n, alpha, bandwidth):
    gen = torch.Generator().manual_seed(7)
    noise = 1 + 0.03 * torch.randn(len(SIZES), generator=gen, dtype=torch.float64)  # 3% multiplicative
    times = [allreduce_s(alpha, bandwidth, s, n, algorithm) * float(e) for s, e in zip(SIZES, noise)]
    got_alpha, got_bandwidth = fit_alpha_beta(SIZES, times, n, algorithm)
    assert got_alpha == pytest.approx(alpha, rel=0.08) and got_bandwidth == pytest.approx(bandwidth, rel=0.08)
    # the form matters: the same timings read with the other algorithm's coefficients give another α
    other = "ring" if algorithm == "rabenseifner" else "rabenseifner"
    if coefficients(other, n) != coefficients(algorithm, n):
        assert fit_alpha_beta(SIZES, times, n, other)[0] != pytest.approx(alpha, rel=0.08)


def test_the_fit_refuses_what_cannot_determine_two_unknowns():
    with pytest.raises(ConfigurationError, match="two or more sizes"):
        fit_alpha_beta([4096, 4096], [1e-3, 1e-3], 2)
    with pytest.raises(ConfigurationError, match="2 or more ranks"):
        fit_alpha_beta(SIZES[:2], [1e-3, 2e-3], 1)


def test_fit_sweep_reports_residuals_per_size():
    rows = [
        {
            "collective": "allreduce",
            "status": "ok",
            "backend": "horovod",
            "launcher": "mpirun",
            "transport": "mpi",
            "processes": 2,
            "size_bytes": s,
            "time_us": (1e-3 + allreduce_s(1e-4, 1e9, s, 2)) * 1e6,
        }
        for s in SIZES[:4]
    ]
    (fit,) = fit_sweep(rows)
    assert fit["algorithm"] == "rabenseifner" and fit["status"] == "ok" and fit["link"] == "one host"
    assert fit["fixed_us"] == 1000  # horovod's cycle, known, subtracted before the fit
    assert fit["alpha_us"] == pytest.approx(100, rel=1e-6) and fit["bandwidth_gbs"] == pytest.approx(1.0, rel=1e-6)
    assert fit["max_residual"] < 1e-6 and len(fit["residuals"]) == 4


def _cell(backend, launcher, no_sync):
    task = {"model": "mlp(width=16)", "grad_bytes": 5928, "no_sync_step_s": no_sync}
    return {
        "kind": "train",
        "id": f"{backend}-r1",
        "group": backend,
        "backend": backend,
        "launcher": launcher,
        "nproc": 2,
        "models": ["mlp:width=16"],
        "ranks": [{"tasks": {"train/mlp:width=16": task}}] * 2,
    }


def _row(backend, launcher, **extra):
    return {
        "model": "mlp(width=16)",
        "scaling": "weak",
        "backend": backend,
        "launcher": launcher,
        "processes": 2,
        "transport": "gloo",
        "parameters": 1482,
        "batch_per_rank": 32,
        "step_ms_median": 12.0,
        **extra,
    }


def _fit(backend, launcher):
    return {
        "backend": backend,
        "launcher": launcher,
        "processes": 2,
        "status": "ok",
        "algorithm": "ring",
        "alpha_s": 100e-6,
        "bandwidth_bps": 1e9,
        "link": "one host",
    }


def test_a_prediction_uses_the_rows_own_compute_gradient_and_fit():
    # mlp:width=16 on 8x8 images: 1482 parameters, 5928 bytes of gradients, one DDP bucket (< 1 MiB)
    cells = [_cell("ddp-gloo", "torchrun", [0.010, 0.012, 0.011])]
    rows = [_row("ddp-gloo", "torchrun"), _row("ddp-gloo", "torchrun", processes=1)]
    (detail,) = predict_rows(rows, [_fit("ddp-gloo", "torchrun")], cells)
    comm = 2 * 1 * 100e-6 + 2 * 1 / 2 * 5928 / 1e9  # ring, n = 2: 2(n-1)α + 2(n-1)/n S/B
    assert detail["messages"] == [["allreduce", 5928]] and detail["compute_from"] == "no-sync step"
    assert rows[0]["predicted_step_ms"] == pytest.approx(11.0 + comm * 1e3, abs=1e-3)
    assert rows[0]["prediction_error"] == pytest.approx((11.0 + comm * 1e3) / 12.0 - 1, abs=1e-4)
    assert "predicted_step_ms" not in rows[1]  # one process: no sweep, no fit, no prediction


def test_a_backend_the_benchmark_does_not_know_gets_a_no_cost_model_row_not_free_communication():
    cells = [_cell("toy-backend", "torchrun", [0.010, 0.012, 0.011])]
    rows = [_row("toy-backend", "torchrun")]
    (detail,) = predict_rows(rows, [_fit("toy-backend", "torchrun")], cells)
    assert detail["status"].startswith("no cost model for toy-backend") and "comm_ms" not in detail
    assert "predicted_step_ms" not in rows[0]
    assert project([detail]) == []
    with pytest.raises(ConfigurationError, match="no cost model for toy-backend"):
        messages("toy-backend", 1000)


def test_messages_follow_each_backends_own_grouping():
    mib = 1024 * 1024
    assert [s for _, s in messages("ddp-gloo", 60 * mib)] == [mib, 25 * mib, 25 * mib, 9 * mib]
    # with the tensors: buckets in gradient order (last layer first); a bucket closes once past its cap
    assert [s for _, s in messages("ddp-gloo", 0, tensors=[40 * mib, 2 * mib, 400])] == [2 * mib + 400, 40 * mib]
    assert [s for _, s in messages("horovod", 300 * mib)] == [128 * mib, 128 * mib, 44 * mib]
    assert messages("fsdp", 0, units=[10, 20]) == [
        ("allgather", 10),
        ("allgather", 20),
        ("allgather", 10),
        ("reduce_scatter", 10),
        ("reduce_scatter", 20),
    ]
    assert messages("single", 1000) == []


def test_the_projected_efficiency_falls_as_hosts_are_added():
    detail = {
        "model": "m",
        "scaling": "weak",
        "backend": "ddp-gloo",
        "launcher": "torchrun",
        "link": "one host",
        "compute_ms": 20.0,
        "batch_per_rank": 32,
        "messages": [["allreduce", 4_500_000]],
        "algorithm": "ring",
        "alpha_s": 50e-6,
        "bandwidth_bps": 2e9,
    }
    rows = project([detail])
    assert {r["link"] for r in rows} == {"as fitted (one host)", "10 Gbit/s", "100 Gbit/s"}
    for link in {r["link"] for r in rows}:
        effs = [r["efficiency"] for r in sorted((r for r in rows if r["link"] == link), key=lambda r: r["hosts"])]
        assert len(effs) == len(HOSTS) and all(a > b for a, b in zip(effs, effs[1:])) and 0 < effs[-1] < 1
    at = {(r["link"], r["hosts"]): r for r in rows}
    assert at[("10 Gbit/s", 8)]["step_ms"] > at[("100 Gbit/s", 8)]["step_ms"]  # a slower link, a longer step
    r = at[("10 Gbit/s", 32)]
    assert r["samples_per_s"] == pytest.approx(32 * 32 / (r["step_ms"] / 1e3), rel=1e-3)


def test_the_fit_gives_the_same_bits_whatever_the_thread_count():
    """Tables rebuilt from results.json (in another process, with other threads) must match."""
    import random

    rng = random.Random(3)
    sizes = [4096 * 4**i for i in range(8)]
    threads = torch.get_num_threads()
    try:
        for _ in range(40):
            times = [(50e-6 + s / 1e9) * (1 + rng.uniform(-0.3, 0.3)) for s in sizes]
            fits = []
            for count in (1, 2):
                torch.set_num_threads(count)
                fits.append(fit_alpha_beta(sizes, times, 2, "ring", 0.0))
            assert fits[0] == fits[1], times
    finally:
        torch.set_num_threads(threads)


def test_every_backend_paraflow_registers_has_the_benchmarks_facts():
    import paraflow
    from paraflow.bench.backends import FACTS

    assert set(paraflow.available_backends()) <= set(FACTS)
