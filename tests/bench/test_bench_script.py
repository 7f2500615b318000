"""`paraflow bench --script`: an unmodified paraflow script timed under each backend, then ended."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, requires_horovod

import paraflow
from paraflow.bench.rank.script_hook import script_env
from paraflow.tools.launch import run_launch

SCRIPT = Path(__file__).resolve().parent / "scripts" / "endless_train.py"
QUICK = ["--repeat", "1", "--max-repeat", "1", "--no-aa-check", "--no-plots", "--warmup", "2", "--window-steps", "3"]


def bench(tmp_path, env, *args, timeout=300):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "paraflow.cli", "bench", "--script", str(SCRIPT), "--out", str(out), *QUICK, *args]
    result = run_launch(cmd, timeout=timeout, env={**env, "PARAFLOW_BACKEND": None}, cwd=str(ROOT))
    assert not result.timed_out, result.stdout[-3000:] + result.stderr[-3000:]
    return result, json.loads((out / "results.json").read_text())


def test_the_hook_counts_steps_and_samples_and_ends_the_script(tmp_path, monkeypatch):
    for key, value in script_env(tmp_path, warmup=2, steps=4, task="train/script::t.py").items():
        monkeypatch.setenv(key, value)
    stepped = 0

    class Derived(torch.optim.SGD):  # a step inside a hooked step (as horovod's optimizer does): counted once
        def step(self, closure=None):
            return super().step(closure)

    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # SGD.step itself hooked too
    with pytest.raises(SystemExit) as ended:
        with paraflow.init("single") as backend:
            model = backend.wrap_model(torch.nn.Linear(3, 2))
            optimizer = backend.wrap_optimizer(Derived(model.parameters(), lr=0.1), model)
            for _ in range(100):
                model(torch.randn(5, 3)).sum().backward()
                model(torch.randn(5, 3)).sum().backward()  # two forwards per step: 10 samples
                with torch.no_grad():
                    model(torch.randn(7, 3))  # not training: not counted
                optimizer.step()
                stepped += 1
    assert ended.value.code == 0 and stepped == 5  # 2 warm-up + 4 timed, ended inside the 6th step
    task = json.loads((tmp_path / "rank0.json").read_text())["tasks"]["train/script::t.py"]
    assert task["steps"] == 4 and len(task["step_s"]) == 4 and task["window_samples"] == 40
    assert task["samples_per_step"] == 10 and task["parameters"] == 8 and task["param_bytes"] == 32


@requires_horovod
@pytest.mark.timeout(420)
def test_a_script_that_would_train_10000_epochs_is_timed_and_ended(tmp_path, no_leftovers):
    result, results = bench(
        tmp_path,
        no_leftovers,
        "--backend",
        "ddp-gloo,horovod",
        "--launcher",
        "torchrun,mpirun",
        "--nprocs",
        "2",
        "--",
        "--batch-size",
        "8",
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    cells = results["cells"]
    assert {c["group"] for c in cells} == {"single-python-1", "ddp-gloo-torchrun-2", "horovod-mpirun-2"}
    assert all(c["status"] == "ok" for c in cells), [c["error"] for c in cells]
    rows = results["tables"]["training"]
    assert {r["model"] for r in rows} == {"endless_train.py"} and len(rows) == 3
    for row in rows:
        assert row["samples_per_s"] > 0 and row["global_batch"] == 8 * row["processes"]  # the script's --batch-size
        assert row["parameters"] == 8 * 16 + 16 + 16 * 2 + 2 and row["param_mb"] > 0 and row["peak_mem_mb"] > 0
    assert "endless_train.py, 2 processes: " in result.stdout


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    "script_args, message",
    [
        (["--no-wrap-optimizer", "--epochs", "1"], "never called backend.wrap_optimizer"),
        (["--epochs", "1"], r"ended after 4 optimizer step\(s\), before the timed window was full"),
        (["--no-init"], r"never called paraflow.init\(\)"),
    ],
)
def test_a_script_that_cannot_be_timed_fails_with_what_to_change(tmp_path, no_leftovers, script_args, message):
    result, results = bench(tmp_path, no_leftovers, "--backend", "single", "--", *script_args, timeout=150)
    (cell,) = results["cells"]
    assert result.returncode == 1 and cell["status"] == "failed"
    assert __import__("re").search(message, cell["error"]), cell["error"]
    assert "FAILED" in result.stdout
