"""A rank dies, raises, stops answering or skips a collective: the job ends in bounded time and says why.

Real processes under real launchers, 2 ranks, paraflow timeout 10 s (faultkit.TIMEOUT_S). The
soak variants (``make soak``) repeat the kill 20 times at random steps.
"""

import random
import re
import time

import pytest
from conftest import requires_horovod
from faultkit import STARTUP_S, TIMEOUT_S, events, run_worker

NPROC, STEPS = 2, 6
LAUNCHES = [
    pytest.param("ddp-gloo", "torchrun", id="ddp-gloo-torchrun"),
    pytest.param("ddp-gloo", "mpirun", id="ddp-gloo-mpirun"),
    pytest.param("horovod", "mpirun", id="horovod-mpirun", marks=requires_horovod),
    pytest.param("horovod", "horovodrun", id="horovod-horovodrun", marks=requires_horovod),
]
#: How soon after a rank dies every other rank must have exited.
EXIT_BOUND_S = 60


def dead_rank_named(launcher: str, output: str, rank: int) -> bool:
    """Whether the launcher's report names `rank` as killed by SIGKILL."""
    patterns = {
        "torchrun": rf"rank\s*:\s*{rank} \(local_rank: {rank}\)\s*\n\s*exitcode\s*:\s*-9",
        "mpirun": rf"process rank {rank} with PID \d+ on node \S+ exited on signal 9",
        "horovodrun": rf"Process name: {rank}\s*\n\s*Exit code: 137",
    }
    return re.search(patterns[launcher], output) is not None


def run_fault(backend, launcher, fault, rank=1, step=3):
    result = run_worker(
        launcher,
        NPROC,
        "steps.py",
        backend,
        STEPS,
        fault,
        rank,
        step,
        timeout=STARTUP_S + EXIT_BOUND_S + TIMEOUT_S + 30,
    )
    ended = time.time()
    seen = events(result.stdout)
    faults = [e for e in seen if e.get("fault") == fault]
    assert faults, f"the fault never happened:\n{result.stdout}\n{result.stderr[-3000:]}"
    return result, seen, faults[0], ended


def check_kill(backend, launcher, step):
    result, seen, fault, ended = run_fault(backend, launcher, "kill", step=step)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert not any(e.get("done") for e in seen), "a rank finished although its peer was killed"
    assert ended - fault["time"] <= EXIT_BOUND_S, f"ranks took {ended - fault['time']:.0f} s to exit"
    assert dead_rank_named(launcher, output, 1), output[-4000:]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend, launcher", LAUNCHES)
def test_killed_rank_ends_the_job_and_is_named(backend, launcher):
    check_kill(backend, launcher, step=3)


@pytest.mark.soak
@pytest.mark.timeout(300)
@pytest.mark.parametrize("repetition", range(20))
@pytest.mark.parametrize("backend, launcher", LAUNCHES)
def test_soak_killed_rank_at_a_random_step(backend, launcher, repetition):
    check_kill(backend, launcher, step=random.Random(repetition).randint(1, STEPS))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend, launcher", LAUNCHES)
def test_raising_rank_traceback_comes_first(backend, launcher):
    result, seen, fault, ended = run_fault(backend, launcher, "raise")
    assert result.returncode != 0
    assert not any(e.get("done") for e in seen)
    assert ended - fault["time"] <= EXIT_BOUND_S, f"ranks took {ended - fault['time']:.0f} s to exit"
    tracebacks = result.stderr.split("Traceback (most recent call last):")
    assert len(tracebacks) > 1, result.stderr[-3000:]
    first = tracebacks[1]
    assert "InjectedFailure: injected failure on rank 1 at step 3" in first, result.stderr[-5000:]
    if launcher in ("mpirun", "horovodrun"):  # paraflow's own words name the rank, not only the launcher's
        assert re.search(r"paraflow: rank 1 of 2 left the job on an uncaught InjectedFailure", result.stderr), (
            result.stderr[-5000:]
        )
    if launcher == "torchrun":  # the elastic error file makes it the root cause in torchrun's summary
        root = result.stderr.split("Root Cause (first observed failure):", 1)[1]
        assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)", root) and "InjectedFailure" in root, root


def _stall_cases():
    """Every launch with both faults; the two slowest (torchrun and horovodrun wait 30 s before
    they SIGKILL a stopped rank) run in the soak mode only, to keep the default run short."""
    for launch in LAUNCHES:
        backend, launcher = launch.values
        for fault in ("stop", "skip"):
            slow = fault == "stop" and launcher in ("torchrun", "horovodrun")
            marks = [*launch.marks, *([pytest.mark.soak] if slow else [])]
            yield pytest.param(backend, launcher, fault, id=f"{launch.id}-{fault}", marks=marks)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend, launcher, fault", list(_stall_cases()))
def test_unanswering_rank_gives_a_timeout_naming_the_collective(backend, launcher, fault):
    result, seen, injected, _ = run_fault(backend, launcher, fault)
    errors = [e for e in seen if e.get("rank") == 0 and e.get("error")]
    assert errors, f"rank 0 raised nothing:\n{result.stdout}\n{result.stderr[-3000:]}"
    error = errors[0]
    assert error["error"] == "CollectiveTimeoutError", error
    assert error["message"].startswith("allreduce on rank 0 of 2") and "rank 1 did not join" in error["message"]
    waited = error["time"] - injected["time"]
    assert waited <= TIMEOUT_S + 10, f"the timeout error came {waited:.1f} s after the rank went quiet"
    assert result.returncode != 0
