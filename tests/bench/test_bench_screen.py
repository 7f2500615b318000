"""The answer on one screen: your factories under three backends, verdict first, at most 60 lines."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import requires_horovod

from paraflow.bench.report.screen import compact_rows, headline, headlines
from paraflow.tools.launch import run_launch

FACTORIES = Path(__file__).resolve().parent / "factories"
MODELS = ["bench_factories:pair:hidden=40", "bench_factories:bare:width=4"]
LABELS = ["bench_factories:pair(hidden=40)", "bench_factories:bare(width=4)"]


def entry(**extra):
    other = {"name": "ddp-gloo · torchrun", "factor": 1.18, "low": 1.10, "high": 1.26, "slower": True}
    base = {
        "model": "resnet",
        "scaling": "weak",
        "processes": 2,
        "first": "horovod · mpirun",
        "fastest": ["horovod · mpirun"],
        "slower": [other],
        "no_significant_difference": [],
        "text": "",
    }
    return {**base, **extra}


def test_a_headline_names_both_sides_the_interval_and_the_fastest():
    assert headline(entry()) == (
        "resnet, 2 processes: horovod·mpirun 1.18× [1.10, 1.26] the throughput of ddp-gloo·torchrun; "
        "fastest here: horovod·mpirun"
    )
    tie = {"name": "ddp-gloo · torchrun", "factor": 1.01, "low": 0.95, "high": 1.07, "slower": False}
    line = headline(
        entry(fastest=["ddp-gloo · torchrun", "horovod · mpirun"], slower=[], no_significant_difference=[tie])
    )
    assert "1.01× [0.95, 1.07] the throughput of ddp-gloo·torchrun (no significant difference)" in line
    assert line.endswith("fastest here: ddp-gloo·torchrun = horovod·mpirun (within noise of each other)")


def test_alone_at_its_process_count_it_is_set_against_single():
    alone = entry(slower=[], fastest=["horovod · mpirun"])
    row = {"model": "resnet", "backend": "horovod", "launcher": "mpirun", "processes": 2, "scaling": "weak"}
    row.update(scaling_efficiency=0.45, scaling_efficiency_low=0.4, scaling_efficiency_high=0.5)
    assert headlines([alone], [row]) == [
        "resnet, 2 processes: horovod·mpirun only; 0.90× [0.80, 1.00] the throughput of single·python (1 process): "
        "scaling efficiency 45%"
    ]
    assert headline(alone).endswith("horovod·mpirun only, nothing to compare with here")


def test_one_headline_per_model_at_its_largest_process_count():
    lines = headlines(
        [entry(processes=1), entry(), entry(model="gpt", processes=2), entry(scaling="strong", processes=4)]
    )
    assert len(lines) == 2 and lines[0].startswith("resnet, 2 processes") and lines[1].startswith("gpt, 2 processes")


def test_the_compact_table_keeps_weak_default_rows():
    rows = [
        {"model": "m", "scaling": "weak", "backend": "single", "launcher": "python", "processes": 1, "status": "ok"},
        {"model": "m", "scaling": "strong", "backend": "single", "launcher": "python", "processes": 1, "status": "ok"},
    ]
    rows[0].update(samples_per_s=100.0, samples_per_s_low=90.0, samples_per_s_high=110.0, parameters=2_000_000)
    rows[0].update(param_mb=8.0, peak_mem_mb=300.0)
    (row,) = compact_rows(rows)
    assert row["samples"] == "100 [90–110]" and row["params"] == "2.00 M / 8 MB" and row["rss"] == "300"


@requires_horovod
@pytest.mark.timeout(600)
def test_two_factories_under_three_backends_fit_on_one_screen(tmp_path, no_leftovers):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "paraflow.cli", "bench", "--model", MODELS[0], "--model", MODELS[1]]
    cmd += ["--input-shape", "3,8,8", "--classes", "5", "--backend", "single,ddp-gloo,horovod", "--nprocs", "2"]
    cmd += ["--repeat", "2", "--max-repeat", "2", "--window-steps", "2", "--warmup", "1", "--max-warmup", "0.05"]
    cmd += ["--min-window", "0", "--min-bytes", "4K", "--max-bytes", "16K", "--no-plots"]
    cmd += ["--launch-timeout", "120", "--out", str(out)]
    # run from the factories' folder: --model imports from the current directory
    result = run_launch(cmd, timeout=560, env={**no_leftovers, "PARAFLOW_BACKEND": None}, cwd=str(FACTORIES))
    text = result.stdout + result.stderr
    assert not result.timed_out and result.returncode == 0, text[-5000:]
    assert text.count("\n") <= 60, text
    results = json.loads((out / "results.json").read_text())
    rows = results["tables"]["training"]
    assert {r["backend"] for r in rows} == {"single", "ddp-gloo", "horovod"}
    assert {r["model"] for r in rows} == set(LABELS) and all(r["status"] == "ok" for r in rows)
    assert all(r["parameters"] > 0 and r["param_mb"] > 0 and r["peak_mem_mb"] > 0 for r in rows)
    pair = [r for r in rows if r["model"] == LABELS[0]]
    assert all(r["batch_per_rank"] == 8 for r in pair)  # the factory's own batch
    verdict, table = text.index("Verdict (throughput"), text.index("backend·launcher")
    assert verdict < table
    for label in LABELS:
        assert f"  {label}, 2 processes: " in text[verdict:table] and text[table:].count(label) == 4
