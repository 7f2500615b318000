"""What each rank does before and around its timed steps: warm-up, and how it leaves."""

import os

import pytest

from paraflow.bench.rank.train_loop import settled


def test_warm_up_ends_when_step_times_settle():
    assert not settled([1.0] * 9)  # too few to compare two windows of 5
    assert settled([9.0, 5.0, 1.0, 1.05, 0.98, 1.0, 1.02, 0.99, 1.0, 1.01])
    assert not settled([5.0, 4.0, 3.0, 3.0, 3.0, 1.0, 1.0, 1.0, 1.0, 1.0])  # still falling
    assert settled([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.05, 1.05, 1.08])  # within 10%


def test_worker_skips_interpreter_teardown_except_under_mpi(monkeypatch):
    from paraflow.bench.rank import worker

    exits = []
    monkeypatch.setattr(worker.os, "_exit", exits.append)
    for key in [k for k in os.environ if k.startswith(("OMPI_", "PMI", "PMIX_"))]:
        monkeypatch.delenv(key)
    worker.leave(3)
    assert exits == [3]  # straight out, once the rank file is written
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
    with pytest.raises(SystemExit) as exited:  # MPI_Finalize must run at interpreter exit
        worker.leave(4)
    assert exited.value.code == 4 and exits == [3]
