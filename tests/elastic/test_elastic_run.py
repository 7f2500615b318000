"""The run wrapper and the state in one process: which recovery each launcher gives, the error under
a launcher that cannot replace a worker, commits kept in memory or in a checkpoint."""

from __future__ import annotations

import types

import pytest
import torch

import paraflow
from paraflow.elastic import NotElasticError, State, recovery_mode, run
from paraflow.environment.launchers import ProcessEnvironment, registered_launchers
from paraflow.errors import CollectiveError


def fake_backend(launcher: str, rank: int = 0, world: int = 2) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        env=ProcessEnvironment(launcher, rank, world, rank, world),
        name="ddp-gloo",
        rank=rank,
        world_size=world,
        is_main=rank == 0,
        unwrap=lambda m: m,
    )


def test_each_launcher_says_how_it_recovers(monkeypatch):
    backend = fake_backend("torchrun")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")
    assert recovery_mode(backend) == "once"
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "2")
    assert recovery_mode(backend) == "restart"
    backend = fake_backend("horovodrun")
    assert recovery_mode(backend) == "once"
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    assert recovery_mode(backend) == "rollback"
    for launcher in ("openmpi", "slurm", "mpich", "python"):
        assert recovery_mode(fake_backend(launcher)) == "once"
    assert {x.recovery for x in registered_launchers()} == {None, "restart", "rollback"}


@pytest.mark.parametrize("launcher", ["openmpi", "slurm"])
def test_a_lost_worker_under_a_launcher_that_cannot_restart_names_the_ones_that_can(launcher):
    state = State(torch.nn.Linear(2, 2), backend=fake_backend(launcher), epoch=0)
    calls = []

    @run
    def train(state):
        calls.append(1)
        raise CollectiveError("the connection to rank 1 was lost")

    with pytest.raises(NotElasticError) as info:
        train(state)
    assert len(calls) == 1, "it runs once"
    text = str(info.value)
    assert "the connection to rank 1 was lost" in text
    label = paraflow.environment.launchers.launcher_label(launcher)
    assert f"{label} was not launched to replace a lost worker" in text
    assert "torchrun --nnodes MIN:MAX" in text and "horovodrun -np N --min-np MIN" in text
    assert isinstance(info.value.__cause__, CollectiveError)


def test_other_errors_leave_as_they_are():
    state = State(backend=fake_backend("openmpi"), epoch=0)

    @run
    def train(state):
        raise KeyError("mine")

    with pytest.raises(KeyError, match="mine"):
        train(state)


@pytest.fixture(scope="module")
def single():
    with paraflow.init("single", banner=False) as backend:
        yield backend


def test_a_commit_in_memory_is_restored_with_the_user_fields(single):
    model = single.wrap_model(torch.nn.Linear(3, 1))
    optimizer = single.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model)
    state = State(model, optimizer, backend=single, epoch=1, step=7)
    state._in_memory = True
    state.commit()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    state.epoch, state.step = 2, 9
    assert state.restore()
    assert (state.epoch, state.step) == (1, 7)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key])
    assert optimizer.state_dict()["state"] == {}, "the optimizer's momentum goes back too"


def test_commits_go_to_the_checkpoint_every_save_every(single, tmp_path):
    path = tmp_path / "state.pt"
    model = single.wrap_model(torch.nn.Linear(3, 1))
    state = State(model, backend=single, checkpoint=str(path), save_every=2, step=0)
    state.step = 1
    state.commit()
    assert not path.exists()
    state.step = 2
    state.commit()
    assert path.exists()
    state.step = 5
    assert state.restore() and state.step == 2
    assert not State(model, backend=single, checkpoint=str(tmp_path / "none.pt"), step=0).restore()


def test_reset_callbacks_get_the_new_world_size(single):
    seen = []
    state = State(backend=single, step=0)
    state.register_reset_callbacks([lambda world: seen.append(world), lambda: seen.append("none")])
    state.on_reset()
    assert seen == [1, "none"]


def test_a_field_may_not_take_a_name_of_the_state(single):
    for name in ("commits", "recoveries", "_saved"):
        with pytest.raises(ValueError, match=f"'{name}' is a name of the state itself"):
            State(backend=single, **{name: 0})


def test_every_restore_from_the_checkpoint_counts_though_the_agent_counts_none(single, tmp_path, monkeypatch):
    # torchrun's agents do not count a restart for a host that joined, nor does an agent that joined
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    state = State(backend=single, checkpoint=str(tmp_path / "state.pt"), step=0)
    state.commit()
    seen = []

    @run
    def attempt(state):
        seen.append(state.recoveries)
        if len(seen) < 3:
            raise KeyError("stopped")

    for _ in range(2):
        with pytest.raises(KeyError):
            attempt(state)
    attempt(state)
    assert seen == [1, 2, 3]
    assert [p.name for p in tmp_path.iterdir()] == ["state.pt"], "the count goes once the job is done"
