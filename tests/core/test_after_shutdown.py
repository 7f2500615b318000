"""After shutdown() every collective raises the same paraflow error, on every backend."""

import pytest
from conftest import WORKERS, launch_ok, requires_horovod
from reliability.faultkit import events

LAUNCHES = [
    pytest.param("single", "python", 1, id="single"),
    pytest.param("dp", "python", 1, id="dp", marks=pytest.mark.soak),  # single's collectives, another wrapper
    pytest.param("ddp-gloo", "torchrun", 2, id="ddp-gloo-torchrun"),
    pytest.param("horovod", "mpirun", 2, id="horovod-mpirun", marks=requires_horovod),
    # The same check as under mpirun (the controller plays no part); kept out of the default run.
    pytest.param("horovod", "horovodrun", 2, id="horovod-horovodrun", marks=[requires_horovod, pytest.mark.soak]),
]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("backend, launcher, nproc", LAUNCHES)
def test_every_collective_after_shutdown_raises_not_initialised(backend, launcher, nproc):
    result = launch_ok(launcher, nproc, [WORKERS / "after_shutdown.py", backend], timeout=150)
    seen = events(result.stdout)
    assert len(seen) == 4 * nproc, result.stdout + result.stderr[-3000:]
    for outcome in seen:
        assert outcome["type"] == "NotInitializedError" and outcome["paraflow"], outcome
        assert outcome["message"] == f"backend {backend!r} is not initialised (or was shut down); call init() first.", (
            outcome
        )
