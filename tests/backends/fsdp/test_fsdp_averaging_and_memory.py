"""Gradients averaged, not summed, and the model state one rank holds (from tensor sizes) with its
benchmark column; tests/backends/fsdp/workers/checks.py runs once per backend for both."""

from pathlib import Path

import pytest
from conftest import launch_ok, read_rank_json

from paraflow.bench.report.tables import TRAINING_COLUMNS, build_tables

# Its tests share launches (a module-scoped fixture): under `pytest -n 2 --dist loadgroup` they stay in one process.
pytestmark = pytest.mark.xdist_group("fsdp-averaging")

CHECKS = Path(__file__).resolve().parent / "workers" / "checks.py"


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    """Per backend, lazily: every rank's result of the checks worker at 2 ranks."""
    cache = {}

    def get(backend):
        if backend not in cache:
            out = tmp_path_factory.mktemp(f"checks-{backend}")
            launch_ok("torchrun", 2, [CHECKS, backend, out], timeout=180)
            cache[backend] = read_rank_json(out, 2)
        return cache[backend]

    return get


@pytest.mark.timeout(300)
def test_fsdp_gradients_are_averaged_over_ranks_not_summed(checks):
    for result in checks("fsdp"):
        assert result["ranks_differ"] > 1e-3  # else mean and sum could not be told apart
        assert result["error_vs_mean"] < 1e-12
        assert result["error_vs_sum"] > 1e-3


@pytest.mark.timeout(300)
def test_fsdp_rank_holds_half_the_model_state_of_a_ddp_rank(checks):
    full = checks("ddp-gloo")[0]["full_parameter_bytes"]
    held = {backend: [r["model_state_bytes"] for r in checks(backend)] for backend in ("fsdp", "ddp-gloo")}
    for ddp in held["ddp-gloo"]:  # a replica: all of it, and AdamW's two moments
        assert ddp["parameters"] == ddp["gradients"] == full
        assert ddp["optimizer"] >= 2 * full
    for fsdp, ddp in zip(held["fsdp"], held["ddp-gloo"]):
        for part in ("parameters", "gradients", "optimizer"):
            assert fsdp[part] / ddp[part] == pytest.approx(0.5, abs=0.02), part
        assert sum(fsdp.values()) / sum(ddp.values()) == pytest.approx(0.5, abs=0.02)


def test_training_table_shows_model_state_next_to_peak_memory():
    def task(held):
        return {
            "model": "mlp",
            "model_spec": "mlp",
            "parameters": 10,
            "grad_bytes": 40,
            "batch_per_rank": 4,
            "samples_per_step": 4,
            "steps": 2,
            "step_s": [0.01, 0.01],
            "window_s": 0.02,
            "losses": [2.0, 1.0],
            "peak_rss_bytes": 300e6,
            **({"model_state_bytes": held} if held else {}),
        }

    def cell(backend, tasks):
        ranks = [{"rank": r, "device": "cpu", "tasks": {"train/mlp": t}} for r, t in enumerate(tasks)]
        return {"kind": "train", "backend": backend, "launcher": "torchrun", "nproc": len(tasks), "threads": 1} | {
            "id": f"{backend}-torchrun-{len(tasks)}",
            "models": ["mlp"],
            "status": "ok",
            "ranks": ranks,
        }

    keys = list(TRAINING_COLUMNS)
    assert keys.index("model_state_mb") == keys.index("peak_mem_mb") + 1
    rows = build_tables(
        [
            cell(
                "fsdp",
                [
                    task({"parameters": 1e6, "gradients": 1e6, "optimizer": 2e6}),
                    task({"parameters": 1.5e6, "gradients": 1e6, "optimizer": 2e6}),
                ],
            ),
            cell("ddp-gloo", [task(None), task(None)]),  # recorded before model state was measured
        ]
    )["training"]
    assert [r["model_state_mb"] for r in rows] == [4.5, None]  # the largest rank's, in MB
