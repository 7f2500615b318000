"""train.py under fsdp: it learns the digits data like every backend, and uneven shards get the fix."""

import json

import pytest
from conftest import ROOT, launch, launch_ok

TRAIN = ROOT / "train.py"


@pytest.mark.timeout(240)
def test_train_reaches_accuracy_bar_on_digits_under_fsdp(tmp_path):
    out = tmp_path / "result.json"
    launch_ok("torchrun", 2, [TRAIN, "--backend", "fsdp", "--data", "digits", "--json-out", out], timeout=180)
    summary = json.loads(out.read_text())
    assert summary["backend"] == "fsdp" and summary["world_size"] == 2
    assert summary["parameters"] == 26_122  # the whole model's count, not a shard's
    assert summary["accuracy"] >= 0.95, summary


@pytest.mark.timeout(240)
def test_uneven_shards_are_refused_with_drop_last(tmp_path):
    # 3,277 synthetic samples over 2 ranks in batches of 1: 1,639 and 1,638 batches, so join would be needed.
    argv = [TRAIN, "--backend", "fsdp", "--data", "synthetic", "--batch-size", 1, "--max-steps", 1]
    result = launch("torchrun", 2, argv, timeout=180)
    assert result.returncode != 0
    assert "fsdp cannot let ranks finish early" in result.stdout + result.stderr
    assert "(train.py --drop-last)" in result.stdout + result.stderr
