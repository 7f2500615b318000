"""Every public collective gives exact results and is one library collective (two with the check),
reached through at most three paraflow files: the public call, its per-call record, the backend's
one-call method."""

import pytest
from conftest import WORKERS, launch_ok, read_rank_json, requires_horovod

MIXED_CALLS = 24  # tests/workers/collective_paths.py: mixed_calls


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "backend, launcher",
    [("ddp-gloo", "torchrun"), pytest.param("horovod", "mpirun", marks=requires_horovod)],
)
def test_exact_results_and_one_library_collective_per_public_call(backend, launcher, tmp_path):
    launch_ok(launcher, 2, [WORKERS / "collective_paths.py", backend, tmp_path], timeout=200)
    for result in read_rank_json(tmp_path, 2):
        for collective, way in result["traced"].items():
            assert way["library"], (collective, "the library's collective was never entered", way)
            assert len(way["files"]) <= 3 and "core/collectives.py" in way["files"], (collective, way["files"])
        for mode in ("plain", "checked"):
            assert sorted(result[mode]) == ["1024", "3", "5000"]
            for n, checks in result[mode].items():
                assert all(v == 0 for v in checks.values()), (result["rank"], mode, n, checks)
        plain, checked = result["count/plain"], result["count/checked"]
        assert plain["public"] == checked["public"] == MIXED_CALLS
        if backend == "ddp-gloo":  # the process group's own count of the collectives it ran
            assert plain["library"] == MIXED_CALLS, plain
            assert checked["library"] == 2 * MIXED_CALLS, checked  # one descriptor allgather more per call
        assert result["final"] == [2.0, 2.0]
