"""A script may start and shut down paraflow twice in one process (a notebook cell run again)."""

import pytest
from conftest import WORKERS, launch_ok, read_rank_json, requires_horovod


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    "backend, launcher",
    [
        pytest.param("ddp-gloo", "torchrun", id="ddp-gloo-torchrun"),
        pytest.param("fsdp", "torchrun", id="fsdp-torchrun"),
        pytest.param("horovod", "mpirun", id="horovod-mpirun", marks=requires_horovod),
    ],
)
def test_a_second_init_in_the_same_process_starts_a_fresh_group(backend, launcher, tmp_path):
    launch_ok(launcher, 2, [WORKERS / "two_sessions.py", backend, tmp_path], timeout=150)
    assert read_rank_json(tmp_path, 2) == [[3.0, 30.0], [3.0, 30.0]]
