"""Jobs whose processes carry nothing but torch's env:// variables, and a launcher of the test's own.

Kubernetes' PyTorchJob starts each pod's ``python train.py`` with MASTER_ADDR, MASTER_PORT,
WORLD_SIZE and RANK only: two such processes train train.py's loop on ddp-gloo and on horovod to
single's parameters. A launcher registered from a script, as a user or a site adds one, detects
the job it started and gives its ranks.
"""

import sys
import textwrap
import threading

import pytest
from conftest import RANK_ENV, ROOT, requires_horovod
from trainkit import assert_same_parameters, exported_parameters, single_reference, train_args

from paraflow.environment.launchers import free_port, launcher_variables
from paraflow.tools.launch import run_launch


def start_ranks(nproc: int, script: list, env_of_rank, timeout: float = 180) -> list:
    """Start `nproc` plain python processes at once, rank r with `env_of_rank(r)` added to a clean
    environment (no launcher's variables); returns their LaunchResults in rank order."""
    clean = {key: None for key in launcher_variables(dict(__import__("os").environ))}
    results = [None] * nproc

    def run(rank: int) -> None:
        env = {**clean, **RANK_ENV, **env_of_rank(rank)}
        results[rank] = run_launch([sys.executable, *map(str, script)], timeout=timeout, env=env, cwd=str(ROOT))

    threads = [threading.Thread(target=run, args=(r,)) for r in range(nproc)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for rank, result in enumerate(results):
        assert result.ok, f"rank {rank} exit {result.returncode}:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return results


def pytorchjob(nproc: int, port: int):
    """What the training operator sets in pod r: the four variables, rank 0's host as MASTER_ADDR."""
    return lambda rank: {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(nproc),
        "RANK": str(rank),
    }


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return single_reference(tmp_path_factory.mktemp("single"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["ddp-gloo", pytest.param("horovod", marks=requires_horovod)])
def test_a_pytorchjob_trains_single_s_model(backend, single, tmp_path):
    out = tmp_path / "params.pt"
    results = start_ranks(2, train_args(backend, out), pytorchjob(2, free_port()))
    assert "launcher torch's env:// variables" in results[0].stderr, results[0].stderr[-2000:]
    assert "one process per host assumed" in results[0].stderr
    assert_same_parameters(exported_parameters(out), single)


TOY_LAUNCHER = textwrap.dedent(
    """
    import sys
    import torch
    import paraflow
    from paraflow.environment.launchers import Identity, Launcher, register_launcher


    class Toy(Launcher):
        '''A site's own launcher: TOY_TASK is this task's number, TOY_TASKS the count, TOY_HEAD rank 0's port.'''

        name = "toy"
        command = "toyrun -n N python train.py"
        rank_variable, world_size_variable = "TOY_TASK", "TOY_TASKS"
        job_variables = ("TOY_HEAD",)

        def identity(self, env):
            world = self.integer(env, "TOY_TASKS")
            return Identity(self.integer(env, "TOY_TASK"), world, 0, 1, "toy: one task per host")

        def master(self, env):
            return "127.0.0.1", int(env["TOY_HEAD"])


    register_launcher(Toy(), before="torchrun")
    with paraflow.init("ddp-gloo") as backend:
        total = backend.allreduce(torch.tensor([float(backend.rank + 1)]), op="sum").item()
        print(f"launcher={backend.launcher} rank={backend.rank} world={backend.world_size} total={total}")
    """
)


@pytest.mark.timeout(120)
def test_a_launcher_registered_by_a_script_detects_its_job(tmp_path):
    script = tmp_path / "toy_job.py"
    script.write_text(TOY_LAUNCHER)
    port = free_port()
    results = start_ranks(2, [script], lambda r: {"TOY_TASK": str(r), "TOY_TASKS": "2", "TOY_HEAD": str(port)}, 100)
    for rank, result in enumerate(results):
        assert f"launcher=toy rank={rank} world=2 total=3.0" in result.stdout, result.stdout
    assert "launcher toy" in results[0].stderr and "toy: one task per host" in results[0].stderr
