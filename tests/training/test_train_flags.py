"""train.py's feature flags on uneven shards: join when batch counts differ, or drop the remainder."""

import json

import pytest
import torch
from conftest import ROOT, launch_ok, requires_horovod

TRAIN = ROOT / "train.py"
# 3277 synthetic training samples: shards of 1639 and 1638, i.e. 4 and 3 batches of 546.
UNEVEN = ["--data", "synthetic", "--batch-size", "546", "--epochs", "2"]
LAUNCHERS = {"ddp-gloo": "torchrun", "horovod": "mpirun"}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["ddp-gloo", pytest.param("horovod", marks=requires_horovod)])
def test_uneven_shards_join_and_checkpoint_after_the_join(tmp_path, backend):
    """With fp16 gradients on the wire too: a finished rank must answer in the same dtype."""
    out, checkpoint = tmp_path / "r.json", tmp_path / "c.pt"
    launch_ok(
        LAUNCHERS[backend],
        2,
        [
            TRAIN,
            "--backend",
            backend,
            *UNEVEN,
            "--save-every",
            "1",
            "--compression",
            "fp16",
            "--checkpoint",
            checkpoint,
            "--json-out",
            out,
        ],
        timeout=180,
    )
    summary = json.loads(out.read_text())
    assert summary["joined"] is True and summary["compression"] == "fp16"
    # Rank 0 ran 4 batches per epoch and rank 1 three: 4 optimizer steps per epoch.
    assert summary["steps"] == 8
    progress = torch.load(checkpoint, weights_only=True)["state"]["progress"]
    assert progress == {"epoch": 2, "sample": 0, "step": 8}


@pytest.mark.timeout(240)
def test_drop_last_gives_equal_shards_without_join(tmp_path):
    out = tmp_path / "r.json"
    launch_ok("torchrun", 2, [TRAIN, "--backend", "ddp-gloo", *UNEVEN, "--drop-last", "--json-out", out], timeout=180)
    summary = json.loads(out.read_text())
    assert summary["joined"] is False and summary["steps"] == 6
