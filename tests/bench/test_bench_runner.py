"""What each launch is given: worker arguments, environment, and the command line that is recorded."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from paraflow.bench.driver.config import BenchConfig
from paraflow.bench.driver.matrix import Cell
from paraflow.bench.driver.runner import MPI_YIELD, OMP_WAIT, cell_env, command_line, worker_args
from paraflow.bench.model_spec import ModelSpec
from paraflow.errors import ConfigurationError

MLP = (ModelSpec.parse("mlp:width=16"),)


def test_cell_env_fixes_threads_and_drops_inherited_launcher_variables(monkeypatch):
    for key, value in {
        "RANK": "3",
        "SLURM_PROCID": "1",
        "HOROVOD_RANK": "0",
        "OMPI_COMM_WORLD_RANK": "2",
        "PARAFLOW_BACKEND": "ddp",
        "KEEP_ME": "1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv(MPI_YIELD, raising=False)
    monkeypatch.delenv(OMP_WAIT, raising=False)
    env = cell_env(Cell("train", "ddp-gloo", "torchrun", 2, 1, MLP), timeout=60)
    assert {k for k, v in env.items() if v is None} == {
        "RANK",
        "SLURM_PROCID",
        "HOROVOD_RANK",
        "OMPI_COMM_WORLD_RANK",
        "PARAFLOW_BACKEND",
    }
    assert env["PARAFLOW_NUM_THREADS"] == env["OMP_NUM_THREADS"] == "1" and env["PARAFLOW_TIMEOUT"] == "60"
    assert "KEEP_ME" not in env and MPI_YIELD not in env
    assert cell_env(Cell("train", "horovod", "mpirun", 2, 1, MLP), 60)[MPI_YIELD] == "1"
    monkeypatch.setenv(MPI_YIELD, "0")  # the user's own choice wins
    assert MPI_YIELD not in cell_env(Cell("train", "horovod", "mpirun", 2, 1, MLP), 60)
    assert env[OMP_WAIT] == "PASSIVE"  # by default OpenMP threads sleep rather than spin at barriers
    monkeypatch.setenv(OMP_WAIT, "ACTIVE")
    assert OMP_WAIT not in cell_env(Cell("train", "single", "python", 1, 2, MLP), 60)


def test_the_verdict_margin_is_a_fraction():
    assert BenchConfig().margin == 0.05 and BenchConfig(margin=0.0).margin == 0.0
    for wrong in (-0.01, 1.0, 5):
        with pytest.raises(ConfigurationError, match="--margin 0.05"):
            BenchConfig(margin=wrong)


def test_command_line_shows_what_the_launch_sets_and_removes():
    line = command_line(["mpirun", "-np", "2", "python", "-m", "w"], {"RANK": None, "A": "1", "B": "x y"})
    assert line == "env -u RANK A=1 'B=x y' mpirun -np 2 python -m w"
    assert command_line(["python", "w.py"], {"A": "1"}) == "A=1 python w.py"


def test_the_worker_gets_the_cells_task_from_the_config():
    config = BenchConfig(models=["mlp:width=16", "cnn"], steps=3, min_window=0.5, sizes=[4096, 16384])
    cell = Cell("train", "ddp-gloo", "torchrun", 2, 1, tuple(config.models), sweep=True)
    out, task = worker_args(cell, config, Path("/o"))[1::2]
    task = json.loads(task)
    assert out == "/o" and task["backend"] == "ddp-gloo" and task["models"] == ["mlp:width=16", "cnn"]
    assert task["sweep_sizes"] == [4096, 16384] and task["collectives"] == ["allreduce"]
    assert task["scaling"] == ["weak"] and task["min_window"] == 0.5 and task["steps"] == 3
    assert task["compile"] is False and task["classes"] == 10 and task["input_shape"] is None
    unswept = json.loads(worker_args(replace(cell, sweep=False), config, Path("/o"))[3])
    assert unswept["sweep_sizes"] == []


def test_missing_tabulate_or_matplotlib_says_how_to_install(monkeypatch):
    import sys

    import pytest

    from paraflow.bench.report.plots import require_pyplot
    from paraflow.bench.report.tables import require_tabulate
    from paraflow.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "tabulate", None)  # makes `import tabulate` fail
    with pytest.raises(MissingDependencyError, match=r"pip install 'paraflow\[bench\]'"):
        require_tabulate()
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingDependencyError, match="--no-plots"):
        require_pyplot()


def test_local_update_skips_horovod_style_synchronisation_only():
    import contextlib

    import torch

    from paraflow.bench.rank.train_loop import local_update

    class Synchronising(torch.optim.SGD):  # the shape of horovod's DistributedOptimizer
        skipped = False

        @contextlib.contextmanager
        def skip_synchronize(self):
            Synchronising.skipped = True
            yield

    param = torch.nn.Parameter(torch.ones(2))
    with local_update(Synchronising([param], lr=0.1)):
        assert Synchronising.skipped
    with local_update(torch.optim.SGD([param], lr=0.1)) as entered:
        assert entered is None
