"""train.py as an equivalence check: a few steps on digits whose exported parameters match `single`'s.

With 2 ranks x B samples per step and one process x 2B, every global batch holds the same samples
(one permutation of the data, dealt out to the ranks), so a correct data-parallel backend ends
where `single` does, up to float32 rounding of the averaged gradients.
"""

from __future__ import annotations

from pathlib import Path

import torch
from conftest import ROOT, launch_ok

TRAIN = ROOT / "train.py"
STEPS, PER_RANK = 6, 16


def train_args(backend: str, out, batch_size: int = PER_RANK) -> list:
    """train.py for a few steps on digits, `batch_size` per rank; the parameters are exported to `out`."""
    steps = ["--max-steps", STEPS, "--batch-size", batch_size, "--export", out]
    return [TRAIN, "--backend", backend, "--data", "digits", *steps]


def exported_parameters(path) -> dict:
    """The model's parameters in a checkpoint train.py exported."""
    return torch.load(path, weights_only=False)["state"]["model"]


def assert_same_parameters(a: dict, b: dict) -> None:
    """Equal up to float32 rounding (the average of two half-batch gradients rounds differently)."""
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5, msg=key)


def single_reference(directory: Path, ranks: int = 2) -> dict:
    """`single`'s parameters after the same steps on the whole global batch of `ranks` ranks."""
    out = Path(directory) / "single.pt"
    launch_ok("python", 1, train_args("single", out, ranks * PER_RANK), timeout=180)
    trained = exported_parameters(out)
    from paraflow.examples.models import build_model

    torch.manual_seed(0)
    initial = build_model("mlp").state_dict()
    assert any(not torch.equal(initial[k], trained[k]) for k in initial), "training moved no parameter"
    return trained
