"""A job that did all its work exits 0, every time, on every backend and launcher.

A thread of paraflow's still inside torch's C++ when the interpreter exits is ended as it takes
the GIL back, inside a C++ destructor, and the process aborts ("terminate called without an
active exception"): the launcher then reports the job failed after every result was printed.
"""

import copy
import sys

import pytest
import torch
from conftest import RANK_ENV, ROOT, WORKERS, launch, requires_horovod

from paraflow.tools.launch import run_launch

SCRIPT = WORKERS / "clean_exit.py"
COLLECTIVES = 24  # tests/workers/clean_exit.py: six rounds of four
ABORTED = ("terminate called", "SIGABRT", "Signal 6", "Aborted", "core dumped", "Fatal Python error")


def assert_clean_exit(result, ranks: int = 2) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"exit {result.returncode}:\n{output[-4000:]}"
    assert not [word for word in ABORTED if word in output], output[-4000:]
    for rank in range(ranks):
        assert f"rank {rank} made {COLLECTIVES} collectives" in result.stdout, result.stdout


@pytest.mark.timeout(120)
def test_shutdown_waits_for_the_stall_watch_to_leave_the_store_before_the_process_exits():
    """The stall watch sits in a store operation (torch's C++) past shutdown: shutdown waits for it."""
    assert_clean_exit(launch("torchrun", 2, [SCRIPT, "ddp-gloo", "slow-store"], timeout=100))


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "backend, launcher, runs",
    [
        ("ddp-gloo", "torchrun", 20),
        ("fsdp", "torchrun", 5),
        pytest.param("horovod", "mpirun", 5, marks=requires_horovod),
    ],
)
def test_the_end_of_a_job_that_did_its_work_exits_0_every_time(backend, launcher, runs):
    for run in range(runs):
        result = launch(launcher, 2, [SCRIPT, backend], timeout=100)
        try:
            assert_clean_exit(result)
        except AssertionError as failure:
            raise AssertionError(f"run {run + 1} of {runs}: {failure}") from None


@pytest.mark.timeout(600)
def test_the_readme_quick_start_under_paraflow_run_exits_0_every_time():
    command = [sys.executable, "-m", "paraflow.cli", "run", "-n", "2", "--backend", "ddp-gloo"]
    command.append(str(ROOT / "docs" / "examples" / "quickstart.py"))
    for run in range(5):
        result = run_launch(command, timeout=150, env=RANK_ENV, cwd=str(ROOT))
        output = result.stdout + result.stderr
        assert result.returncode == 0 and not result.timed_out, (
            f"run {run + 1} of 5, exit {result.returncode}:\n{output[-4000:]}"
        )
        assert not [word for word in ABORTED if word in output], f"run {run + 1} of 5:\n{output[-4000:]}"


def test_a_ddp_model_lets_go_of_its_process_group_last_through_pythons_process_group_object():
    """DDP's reducer (C++) frees what it holds with the GIL held; the process group's Python object
    frees it with the GIL released. The wrapped model holds that object in an attribute set after
    the reducer, so the object, dropped after the reducer, is what frees the process group."""
    import paraflow

    with paraflow.init("ddp-gloo") as backend:
        model = backend.wrap_model(torch.nn.Linear(4, 4))
        names = list(vars(model))
        keeper = [name for name in names if vars(model)[name] is model.process_group and name != "process_group"]
        assert keeper and names.index(keeper[0]) > names.index("reducer"), names
        assert keeper[0] not in copy.deepcopy(model).__getstate__()  # what DDP pickles stays as torch has it


@pytest.mark.timeout(240)
def test_dropping_the_model_after_shutdown_never_hangs():
    """200 rounds of start, train, shut down, drop the model, in one process: with the reducer
    freeing the process group, this hung within tens of rounds (a gloo thread waiting for the GIL
    while the main thread, holding it, waits for that thread)."""
    rounds = 200
    result = run_launch(
        [sys.executable, str(WORKERS / "drop_after_shutdown.py"), str(rounds)],
        timeout=200,
        env={**RANK_ENV, "PARAFLOW_BANNER": "0"},
        cwd=str(ROOT),
    )
    assert not result.timed_out, f"hung: {result.stderr[-3000:]}"
    assert result.returncode == 0 and f"done {rounds}" in result.stdout, result.stderr[-3000:]
