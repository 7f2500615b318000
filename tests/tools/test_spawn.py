"""paraflow.launch: values in rank order, failures re-raised with rank and traceback, time limit, stdin."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from conftest import ROOT, requires_horovod

import paraflow
from paraflow.errors import ConfigurationError, LaunchTimeoutError, ParaflowError, RankFailedError


def gather_identity(backend, offset):
    print(f"hello from rank {backend.rank}")
    total = backend.allreduce(torch.tensor([float(backend.rank + offset)]), op="sum")
    return backend.rank, backend.world_size, backend.launcher, total.item()


def test_ddp_gloo_values_come_back_in_rank_order_with_prefixed_output(no_leftovers, capsys):
    values = paraflow.launch(gather_identity, 10, nprocs=2, backend="ddp-gloo", time_limit=240)
    assert values == [(0, 2, "paraflow-launch", 21.0), (1, 2, "paraflow-launch", 21.0)]
    out = capsys.readouterr().out
    assert "[rank0] hello from rank 0" in out and "[rank1] hello from rank 1" in out


@requires_horovod
def test_horovod_values_come_back_in_rank_order(no_leftovers):
    def per_rank(backend):
        return backend.rank, backend.controller, backend.allgather(torch.tensor([backend.rank * 3]))[1].item()

    assert paraflow.launch(per_rank, nprocs=2, backend="horovod", time_limit=240) == [(0, "gloo", 3), (1, "gloo", 3)]


def _fail_deep_inside(rank):
    raise ValueError(f"rank {rank} found a bad value")


def raise_on_rank_one(backend):
    if backend.rank == 1:
        _fail_deep_inside(backend.rank)
    backend.barrier()  # rank 0 would wait here for the collective timeout (600 s) if not stopped
    return backend.rank


def test_a_raising_rank_is_reraised_with_its_rank_and_traceback(no_leftovers):
    with pytest.raises(RankFailedError) as info:
        paraflow.launch(raise_on_rank_one, nprocs=2, backend="ddp-gloo", time_limit=240)
    err = info.value
    assert isinstance(err, ParaflowError) and isinstance(err, RuntimeError)
    assert (err.rank, err.error_type) == (1, "ValueError")
    assert str(err).startswith("rank 1 of 2 raised ValueError: rank 1 found a bad value")
    # the caller's file and source lines are put back into the frames of code sent by value
    assert f'File "{__file__}"' in err.traceback and "in _fail_deep_inside" in err.traceback
    assert 'raise ValueError(f"rank {rank} found a bad value")' in err.traceback
    assert "tools/spawn.py" not in err.traceback


def sleep_on_rank_one(backend):
    if backend.rank == 1:
        print("rank 1 goes to sleep", flush=True)
        time.sleep(600)
    return backend.rank


def test_a_hanging_rank_ends_at_the_time_limit_with_nothing_left(no_leftovers):
    with pytest.raises(LaunchTimeoutError) as info:
        paraflow.launch(sleep_on_rank_one, nprocs=2, backend="ddp-gloo", time_limit=15)
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, ParaflowError)
    assert 1 in info.value.unfinished
    assert "time_limit=15 s" in str(info.value)


def kill_rank_zero(backend):
    if backend.rank == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    backend.barrier()


def test_a_killed_rank_is_named_with_its_signal(no_leftovers):
    with pytest.raises(RankFailedError) as info:
        paraflow.launch(kill_rank_zero, nprocs=2, backend="ddp-gloo", time_limit=240)
    assert (info.value.rank, info.value.error_type) == (0, "killed by SIGKILL")


def test_a_death_seen_after_the_peer_lost_it_is_still_the_rank_reported():
    """The caller may see a killed rank go after its peer has raised on the lost connection."""
    from paraflow.tools.spawn import RankOutcome, _describe, raise_for_outcomes

    message = "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:7821"
    try:
        raise RuntimeError(message)
    except RuntimeError as exc:
        lost = _describe(exc)
    survivor = RankOutcome(1, status="error", error=lost, returncode=1)
    killed = RankOutcome(0, status="died", returncode=-signal.SIGKILL, ended_at=lost["time"] + 1.0)
    with pytest.raises(RankFailedError) as info:
        raise_for_outcomes([killed, survivor], None)
    assert (info.value.rank, info.value.error_type) == (0, "killed by SIGKILL")
    assert info.value.others == {1: f"RuntimeError: {message}"}


def test_a_function_read_from_stdin_and_import_paraflow_stays_light(no_leftovers):
    program = (
        "import sys, paraflow, torch\n"
        "assert 'cloudpickle' not in sys.modules and 'paraflow.tools.spawn' not in sys.modules\n"
        "def total(backend, x):\n"
        "    return backend.rank, backend.allreduce(torch.tensor([x]), op='sum').item()\n"
        "print('RESULT', paraflow.launch(total, 21, nprocs=2, backend='ddp-gloo', time_limit=240))\n"
    )
    done = subprocess.run(
        [sys.executable, "-"], input=program, capture_output=True, text=True, timeout=300, cwd=str(ROOT)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RESULT [(0, 42), (1, 42)]" in done.stdout


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: paraflow.launch(print, nprocs=0), "nprocs must be a positive integer"),
        (lambda: paraflow.launch("not a function", nprocs=2), "needs a function"),
        (lambda: paraflow.launch(print, nprocs=2, backend="single"), "runs in one process"),
        (lambda: paraflow.launch(print, nprocs=2, time_limit=0), "time_limit must be a positive number"),
        (lambda: paraflow.launch(print, nprocs=2, backend="ddp-gloo", bucket_size=3), "does not take option"),
        (lambda: paraflow.launch(print, threading.Lock(), nprocs=1, backend="single"), "cannot send the function"),
    ],
)
def test_bad_calls_fail_before_any_process_starts(call, words, no_leftovers):
    with pytest.raises(ConfigurationError, match=words):
        call()
