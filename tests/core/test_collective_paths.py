"""Public collectives with tensors below, at and above the size that rides along with the check."""

import pytest
from conftest import WORKERS, launch_ok, read_rank_json, requires_horovod


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "backend, launcher",
    [("ddp-gloo", "torchrun"), pytest.param("horovod", "mpirun", marks=requires_horovod)],
)
def test_small_and_large_tensors_give_exact_results_and_mismatches_fail_everywhere(backend, launcher, tmp_path):
    launch_ok(launcher, 2, [WORKERS / "collective_paths.py", backend, tmp_path], timeout=200)
    for result in read_rank_json(tmp_path, 2):
        lengths = [k for k in result if k.isdigit()]
        assert len(lengths) == 4
        for n in lengths:
            assert all(v == 0 for v in result[n].values()), (result["rank"], n, result[n])
        for case, outcome in result["mismatches"].items():
            assert outcome.startswith("CollectiveError") and "rank 0 called" in outcome, (case, outcome)
        assert "float32[3]" in result["mismatches"]["carried-vs-not"]
        assert "float32[5000]" in result["mismatches"]["carried-vs-not"]
        assert len(result["mismatches"]) == 5
        primed = [k for k in result if k.startswith("primed/")]
        assert len(primed) == 3 and all(result[k] for k in primed), "the repeated call did not start early"
        assert all(result[f"after/{case}"] == 0 for case in result["mismatches"]), result
        assert result["final"] == [2.0, 2.0], "the job is unusable after the mismatches"
