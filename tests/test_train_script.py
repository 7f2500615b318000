"""train.py end to end under real launchers: it must learn the digits data on every backend."""

import json
import re

import pytest
from conftest import ROOT, launch_ok, requires_horovod

TRAIN = ROOT / "train.py"
ACCURACY_BAR = 0.95

CASES = [
    ("single", "python", 1),
    ("dp", "python", 1),
    ("ddp-gloo", "python", 1),
    ("ddp", "torchrun", 2),
    ("ddp-gloo", "mpirun", 2),
    ("horovod", "mpirun", 2),
    ("horovod", "horovodrun", 2),
    ("horovod", "torchrun", 2),
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "backend, launcher, nproc",
    [pytest.param(*c, marks=requires_horovod if c[0] == "horovod" else ()) for c in CASES],
    ids=[f"{b}-{launcher}{n}" for b, launcher, n in CASES],
)
def test_train_reaches_accuracy_bar_on_digits(backend, launcher, nproc, tmp_path):
    out = tmp_path / "result.json"
    result = launch_ok(
        launcher, nproc, [TRAIN, "--backend", backend, "--data", "digits", "--json-out", out], timeout=180
    )
    summary = json.loads(out.read_text())
    assert summary["backend"] == backend and summary["world_size"] == nproc
    assert summary["global_batch_size"] == summary["batch_size"] * nproc
    assert summary["accuracy"] >= ACCURACY_BAR, summary
    assert len(summary["step_times_s"]) == summary["steps"] > 0
    # Only rank 0 prints: one line per epoch.
    # horovodrun prefixes each line with the rank that wrote it: "[0]<stdout>:".
    lines = [line for line in result.stdout.splitlines() if re.sub(r"^\[\d+\]<stdout>:", "", line).startswith("epoch ")]
    assert len(lines) == summary["epochs_run"], result.stdout


def test_steps_limit_stops_early(tmp_path):
    out = tmp_path / "result.json"
    launch_ok(
        "python",
        1,
        [
            TRAIN,
            "--backend",
            "single",
            "--data",
            "synthetic",
            "--model",
            "transformer",
            "--max-steps",
            "3",
            "--json-out",
            out,
        ],
        timeout=120,
    )
    summary = json.loads(out.read_text())
    assert summary["steps"] == 3 and summary["epochs_run"] == 1 and summary["data"] == "synthetic"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--backend", "nope"], "invalid choice: 'nope'"),
        (["--model", "resnet"], "invalid choice: 'resnet'"),
    ],
)
def test_bad_arguments_are_refused(argv, message, tmp_path):
    from conftest import launch

    result = launch("python", 1, [TRAIN, *argv], timeout=60)
    assert result.returncode != 0 and message in result.stderr


def test_single_under_mpirun_fails_fast_with_the_fix():
    from conftest import launch

    result = launch("mpirun", 2, [TRAIN, "--backend", "single", "--max-steps", "1"], timeout=60)
    assert result.returncode != 0
    assert "runs in one process" in result.stderr and "python train.py --backend single" in result.stderr
