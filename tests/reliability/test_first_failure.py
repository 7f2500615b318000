"""The job's last words name the rank that failed first, and why, under mpirun and horovodrun.

Rank 0 or rank 1 calls sys.exit(3) or is SIGKILLed in the middle of a training step (2 ranks,
timeout 10 s). The other rank then loses its connection and fails too; what the launcher prints
last must still blame the rank that failed first, with its exit status or signal. The default
run does sys.exit(3) of rank 1 under mpirun (ddp-gloo) and SIGKILL of rank 0 under horovodrun;
``make soak`` runs every case 10 times.
"""

import re

import pytest
from conftest import requires_horovod
from faultkit import STARTUP_S, TIMEOUT_S, events, run_worker

LAUNCHES = [
    pytest.param("ddp-gloo", "mpirun", id="ddp-gloo-mpirun"),
    pytest.param("horovod", "mpirun", id="horovod-mpirun", marks=requires_horovod),
    pytest.param("horovod", "horovodrun", id="horovod-horovodrun", marks=requires_horovod),
]
FAULTS = [("exit", 1), ("kill", 0), ("exit", 0), ("kill", 1)]
#: The default run: one launch each for the two ways the wrong rank was blamed.
DEFAULT = {("ddp-gloo-mpirun", "exit", 1), ("horovod-horovodrun", "kill", 0)}
REPEATS = 10
#: Statements that blame one rank, with the reason: (pattern, group of the rank, group of the reason).
BLAMES = [
    (r"MPI_ABORT was invoked on rank (\d+) in communicator MPI_COMM_WORLD\s+with errorcode (\d+)", "errorcode"),
    (r"process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+)", "signal"),
    (r"The first process to do so was:\s+Process name:\s+\[\[\d+,\d+\],(\d+)\]\s+Exit code:\s+(\d+)", "exit code"),
    (r"The first process to do so was:\s+Process name: (\d+)\s+Exit code: (\d+)", "exit code"),
    (r"paraflow: rank (\d+) of \d+ left the job with exit status (\d+)", "exit code"),
    (r"the connection to rank (\d+) was lost()", "lost"),  # a survivor's own error: no reason given
]
EXPECTED = {"exit": {"errorcode": "3", "exit code": "3"}, "kill": {"signal": "9", "exit code": "137"}}


def blames(text: str) -> list:
    """(position, rank, kind, value) of every blaming statement, in the order printed."""
    found = []
    for pattern, kind in BLAMES:
        for match in re.finditer(pattern, text):
            found.append((match.start(), int(match.group(1)), kind, match.group(2)))
    return sorted(found)


def check(backend, launcher, fault, rank):
    result = run_worker(launcher, 2, "steps.py", backend, 6, fault, rank, 3, timeout=STARTUP_S + TIMEOUT_S + 60)
    seen = events(result.stdout)
    assert [e for e in seen if e.get("fault") == fault], f"the fault never happened:\n{result.stdout}"
    assert result.returncode != 0 and not any(e.get("done") for e in seen)
    said = blames(result.stderr)
    assert said, result.stderr[-4000:]
    _, blamed, kind, value = said[-1]
    assert blamed == rank and EXPECTED[fault].get(kind) == value, (
        f"the last blame is {said[-1][1:]}, not rank {rank} ({fault}):\n{result.stderr[-5000:]}"
    )


def _cases(repeat: bool):
    for launch in LAUNCHES:
        backend, launcher = launch.values
        for fault, rank in FAULTS:
            if repeat or (launch.id, fault, rank) in DEFAULT:
                yield pytest.param(
                    backend, launcher, fault, rank, id=f"{launch.id}-{fault}-rank{rank}", marks=launch.marks
                )


@pytest.mark.timeout(200)
@pytest.mark.parametrize("backend, launcher, fault, rank", list(_cases(repeat=False)))
def test_the_last_words_name_the_rank_that_failed_first(backend, launcher, fault, rank):
    check(backend, launcher, fault, rank)


@pytest.mark.soak
@pytest.mark.timeout(200)
@pytest.mark.parametrize("repetition", range(REPEATS))
@pytest.mark.parametrize("backend, launcher, fault, rank", list(_cases(repeat=True)))
def test_soak_the_last_words_name_the_rank_that_failed_first(backend, launcher, fault, rank, repetition):
    check(backend, launcher, fault, rank)
