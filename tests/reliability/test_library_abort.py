"""When the communication library kills a rank, paraflow's output says which rank died, where, and
where the other rank was (paraflow.reliability.last_words).

Two ranks of ddp-gloo under mpirun (PARAFLOW_TIMEOUT=20, no PARAFLOW_DEBUG):

- rank 0 gets SIGABRT inside the library call of an allreduce: the line names rank 0, SIGABRT,
  the allreduce's number and call site, and rank 1 in the same allreduce;
- rank 1 leaves out the first collective of a save: its next allgather, of another size, meets
  rank 0's, and gloo aborts rank 0 ("collective mismatch", SIGABRT). mpirun blames rank 0; the
  line must name rank 1 as the rank that was elsewhere.
"""

import re

import pytest
from faultkit import STARTUP_S, events, run_worker

TIMEOUT = "20"


def launch(fault: str, tmp_path):
    job = tmp_path / "job"
    result = run_worker(
        "mpirun",
        2,
        "library_abort.py",
        "ddp-gloo",
        fault,
        tmp_path,
        timeout=STARTUP_S + 90,
        env={"PARAFLOW_TIMEOUT": TIMEOUT, "PARAFLOW_JOB_DIR": str(job)},
    )
    assert [e for e in events(result.stdout) if e.get("fault") == fault], f"no fault:\n{result.stdout[-3000:]}"
    assert result.returncode != 0, result.stderr[-3000:]
    lines = re.findall(r"^paraflow: rank \d+ of 2 died .*$", result.stdout + result.stderr, re.MULTILINE)
    assert lines, f"no last words:\n{result.stderr[-5000:]}"
    return lines, job


#: fault -> the line that must be printed (a regular expression matched at a line's start).
EXPECTED = {
    "abort": r"paraflow: rank 0 of 2 died \(SIGABRT\) in allreduce as collective #(\d+) at library_abort\.py:\d+; "
    r"rank 1 was in allreduce as collective #\1 at library_abort\.py:\d+",
    "skip-in-save": r"paraflow: rank 0 of 2 died \(SIGABRT\) in save at library_abort\.py:\d+, in allgather as "
    r"collective #\d+ \([^)]*\); rank 1 was elsewhere: ",
}


@pytest.mark.timeout(STARTUP_S + 120)
@pytest.mark.parametrize("fault", ["abort", "skip-in-save"])
def test_a_rank_the_library_aborts_is_named_with_where_each_rank_was(fault, tmp_path):
    lines, job = launch(fault, tmp_path)
    assert any(re.match(EXPECTED[fault], line) for line in lines), lines
    assert "Fatal Python error: Aborted" in (job / "rank0.fault").read_text()
