"""Restarted ranks resume from the last checkpoint; more ranks than cores still finish in time."""

import pytest
import torch
from conftest import RANK_ENV, ROOT, requires_horovod
from faultkit import FAULT_WORKERS, STARTUP_S, events, fault_env, run_worker

from paraflow.tools.launch import launch_command, run_launch

STEPS, SAVE_EVERY, KILL_STEP = 9, 2, 5  # killed after step 5: the last checkpoint holds step 4


def torchrun_with_restarts(args, restarts):
    """`torchrun --max-restarts RESTARTS` over 2 ranks of tests/reliability/workers/restart.py."""
    variables = {**RANK_ENV, **fault_env()}
    command = launch_command("torchrun", 2, [str(FAULT_WORKERS / "restart.py"), *map(str, args)])
    at = command.index("torch.distributed.run") + 1
    command[at:at] = ["--max-restarts", str(restarts)]
    result = run_launch(command, timeout=2 * STARTUP_S + 60, env=variables, cwd=str(ROOT))
    assert not result.timed_out and result.returncode == 0, result.stdout + result.stderr
    return events(result.stdout)


@pytest.mark.timeout(300)
def test_killed_rank_restarts_resumes_from_the_checkpoint_and_ends_like_an_uninterrupted_run(tmp_path):
    straight = torchrun_with_restarts(["ddp-gloo", tmp_path / "a.pt", tmp_path / "a.out", STEPS, SAVE_EVERY, 0], 0)
    assert [e["done"] for e in straight if "done" in e] == [STEPS, STEPS]

    seen = torchrun_with_restarts(["ddp-gloo", tmp_path / "b.pt", tmp_path / "b.out", STEPS, SAVE_EVERY, KILL_STEP], 1)
    assert [e["killed_at"] for e in seen if "killed_at" in e] == [KILL_STEP]
    restarted = [e for e in seen if e.get("attempt") == 1 and "resumed_from" in e]
    assert sorted(e["rank"] for e in restarted) == [0, 1], seen
    assert {e["resumed_from"] for e in restarted} == {KILL_STEP - KILL_STEP % SAVE_EVERY}
    assert sorted(e["rank"] for e in seen if e.get("done") == STEPS) == [0, 1]

    a, b = torch.load(tmp_path / "a.out"), torch.load(tmp_path / "b.out")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs from the uninterrupted run"


OVERSUBSCRIBED = [
    pytest.param("ddp-gloo", "mpirun", id="ddp-gloo-mpirun"),
    pytest.param("horovod", "mpirun", id="horovod-mpirun", marks=requires_horovod),
    pytest.param("ddp-gloo", "torchrun", id="ddp-gloo-torchrun", marks=pytest.mark.soak),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend, launcher", OVERSUBSCRIBED)
def test_four_ranks_on_two_cores_finish_without_timeouts(backend, launcher):
    result = run_worker(launcher, 4, "steps.py", backend, 20, timeout=240)
    seen = events(result.stdout)
    assert result.returncode == 0, result.stderr[-4000:]
    assert sorted(e["rank"] for e in seen if e.get("done")) == [0, 1, 2, 3]
    assert not [e for e in seen if e.get("error")]
