"""The last-words record: written in one process, read by another after that process died."""

import io
import os
import subprocess
import sys
import textwrap
import time

import pytest

from paraflow.reliability.activity import read_record
from paraflow.reliability.last_words import (
    JOB_DIR_ENV,
    compose,
    dead_ranks,
    fault_signal,
    job_directory,
    prune,
    report_dead_ranks,
)

# A rank's life up to a SIGABRT inside the library call of an allgather made by a save.
DYING_RANK = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    import torch
    from paraflow.reliability.activity import LastWords, RecordedActivity

    activity = RecordedActivity(LastWords(Path(sys.argv[1]), int(sys.argv[2]), 2))
    model = torch.nn.Linear(2, 2)
    activity.forward_started(True, "train.py:10")
    activity.forward_done(True)
    activity.optimizer_stepped()
    activity.enter("allreduce", "train.py:12", (1, torch.zeros(3), "mean"))
    activity.leave("allreduce")
    if sys.argv[3] == "abort":
        with activity.call("save"):
            activity.enter("allgather", None, (2, torch.zeros(4, dtype=torch.int64), None))
            os.kill(os.getpid(), signal.SIGABRT)
    activity.enter("allreduce", "train.py:12", (2, torch.zeros(3), "mean"))
    sys.stdout.write("waiting\\n")
    sys.stdout.flush()
    sys.stdin.read()
    """
)


def start(directory, rank, how):
    return subprocess.Popen(
        [sys.executable, "-c", DYING_RANK, str(directory), str(rank), how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.timeout(120)
def test_a_rank_that_died_of_sigabrt_is_read_and_reported_once_by_the_first_reader(tmp_path):
    waiting = start(tmp_path, 1, "wait")
    try:
        assert waiting.stdout.readline() == "waiting\n"
        dying = start(tmp_path, 0, "abort")
        dying.communicate(timeout=90)
        assert dying.returncode == -6
        record = read_record(tmp_path / "rank0.rec")
        assert (record["call"], record["site"], record["collective"], record["number"], record["inside"]) == (
            "save",
            "<string>:15",
            "allgather",
            2,
            True,
        )
        assert record["inner"] == "<string>:16, 4 int64" and record["step"] == 1 and not record["ended"]
        assert fault_signal(tmp_path, 0) == "SIGABRT" and fault_signal(tmp_path, 1) is None
        assert dead_ranks(tmp_path) == [0]
        out = io.StringIO()
        assert report_dead_ranks(tmp_path, file=out) == [0]
        assert report_dead_ranks(tmp_path, file=io.StringIO()) == []  # printed once per job
        assert out.getvalue().startswith(  # on a line of its own, whatever another writer left unfinished
            "\nparaflow: rank 0 of 2 died (SIGABRT) in save at <string>:15, in allgather as collective #2 "
            "(<string>:16, 4 int64); rank 1 was elsewhere: in allreduce as collective #2 at train.py:12. "
            f"Its Python stacks: {tmp_path / 'rank0.fault'}."
        ), out.getvalue()
    finally:
        waiting.kill()
        waiting.communicate()


def record(**fields):
    base = {"rank": 0, "world_size": 2, "pid": 0, "call": "idle", "after": "", "site": "t.py:1", "inner": ""}
    return {**base, "collective": "", "number": 0, "inside": False, "ended": False, "step": 0, **fields}


def test_a_rank_killed_without_a_fault_report_and_one_in_backward_are_described():
    dead = record(call="backward", site="t.py:5", step=3, collective="allreduce", number=4)
    other = record(rank=1, call="idle", after="allreduce", collective="allreduce", number=5, site="t.py:9", ended=True)
    text = compose(dead, None, {0: dead, 1: other}, "/d")
    assert text == (
        "paraflow: rank 0 of 2 died without a fault report (SIGKILL, os._exit, the OOM killer) in backward's "
        "gradient reduction (or the optimizer step) after the forward at t.py:5 (step 3), after allreduce as "
        "collective #4; rank 1 was elsewhere: in its own code after allreduce (last paraflow line t.py:9, 5 "
        "collectives made)."
    )


def test_ranks_without_a_record_here_are_named():
    dead = record(world_size=4, call="allreduce", collective="allreduce", number=2, inside=True)
    assert compose(dead, "SIGSEGV", {0: dead}, "/d").endswith(
        "; no record of ranks 1, 2, 3 on this host. Its Python stacks: /d/rank0.fault."
    )


def test_the_job_directory_is_the_launchers_job_or_the_one_chosen():
    assert job_directory({JOB_DIR_ENV: "/x/y"}).as_posix() == "/x/y"
    openmpi = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
    assert job_directory({**openmpi, "PMIX_NAMESPACE": "123", "MASTER_PORT": "9"}).name == "job-123"
    assert job_directory({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}).name == "job-10.0.0.1-29500"
    ranks = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
    torchrun = job_directory({**ranks, "TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "h", "MASTER_PORT": "7"})
    assert torchrun.name == "job-none-7"
    slurm = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_JOB_ID": "55", "SLURM_STEP_ID": "3"}
    assert job_directory(slurm).name == "job-55-3"
    assert job_directory({"PMIX_NAMESPACE": "123"}).name.startswith("job-parent-")  # no launcher's rank: no job


@pytest.mark.timeout(120)
def test_a_rank_reads_no_record_older_than_itself(tmp_path, monkeypatch):
    """torchrun's default job id repeats: an earlier job's dead rank in the same directory is not this job's."""
    from paraflow.reliability import last_words

    earlier = subprocess.run(
        [sys.executable, "-c", "import os, sys; from pathlib import Path; from paraflow.reliability.activity "
         "import LastWords; LastWords(Path(sys.argv[1]), 0, 2); os._exit(0)", str(tmp_path)],
        timeout=90,
    )  # fmt: skip
    assert earlier.returncode == 0 and dead_ranks(tmp_path) == [0]
    monkeypatch.setattr(last_words, "_current", object())
    monkeypatch.setattr(last_words, "_started", time.time())
    assert dead_ranks(tmp_path) == [] and report_dead_ranks(tmp_path, file=io.StringIO()) == []


def test_old_job_directories_are_pruned_but_nothing_else(tmp_path):
    made = {"job-old": ["rank0.fault", "rank0-7.reported"], "job-mixed": ["rank0.fault", "notes.txt"]}
    for name, files in made.items():
        (tmp_path / name).mkdir()
        for file in files:
            (tmp_path / name / file).write_text("x")
    (tmp_path / "job-new").mkdir()
    (tmp_path / "other").mkdir()
    for name in ("job-old", "job-mixed", "other"):
        os.utime(tmp_path / name, (time.time() - 2 * 86400, time.time() - 2 * 86400))
    prune(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job-mixed", "job-new", "other"]
    assert sorted(p.name for p in (tmp_path / "job-mixed").iterdir()) == ["notes.txt"]
