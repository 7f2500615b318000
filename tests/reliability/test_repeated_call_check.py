"""A repeated call's check rides along (on the shared-memory board, or bundled into the allreduce):
results stay exact, and mismatches still fail on every rank and leave the job usable."""

import pytest
from conftest import WORKERS, launch_ok, read_rank_json

from paraflow.reliability.check_board import ENVIRONMENT_SWITCH
from paraflow.reliability.check_bundle import BUNDLE_AFTER

CALLS = BUNDLE_AFTER + 4  # as the worker makes each repeated call

PATHS = [
    ("torchrun", "ddp-gloo", "boarded"),
    ("torchrun-3", "ddp-gloo", "boarded"),
    ("torchrun", "ddp-gloo", "bundled"),
    ("horovodrun", "horovod", "boarded"),
    ("horovodrun", "horovod", "bundled"),
    ("mpirun", "horovod", "boarded"),
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("launcher, name, way", PATHS)
def test_repeated_calls_are_exact_and_mismatches_fail_on_every_rank(tmp_path, launcher, name, way):
    if name == "horovod":
        pytest.importorskip("horovod.torch", reason="horovod is not installed (make install builds it)")
    env = {ENVIRONMENT_SWITCH: "1" if way == "boarded" else "0"}
    launcher, _, ranks = launcher.partition("-")
    nproc = int(ranks or 2)
    launch_ok(launcher, nproc, [WORKERS / "repeated_call.py", tmp_path, name], timeout=200, env=env)
    for result in read_rank_json(tmp_path, nproc):
        assert result["wrong"] and all(v == 0 for v in result["wrong"].values()), result["wrong"]
        assert result[way] >= 4 * len(result["wrong"]), f"the repeated calls were not {way}"
        other = {"boarded": "bundled", "bundled": "boarded"}[way]
        assert result[other] == 0, f"some calls were {other}"
        for case, outcome in result["mismatches"].items():
            assert outcome.startswith("CollectiveError") and "rank 0 called allreduce(float32[5000]" in outcome, (
                case,
                outcome,
            )
            assert result[f"after/{case}"] == 0, (case, "the job is unusable after the mismatch")
        assert len(result["mismatches"]) == 4
        assert result["small_wrong"] == 0
        if way == "boarded":  # a repeated call small enough for the frame moves to the board too
            assert result["small_boarded"] == CALLS - BUNDLE_AFTER, "the repeated small call was not boarded"
        else:
            assert result["small_boarded"] == 0
        assert result["small_mismatch"].startswith("CollectiveError") and "float32[3]" in result["small_mismatch"]
        assert result["together"] == 0
