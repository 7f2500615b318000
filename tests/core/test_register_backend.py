"""paraflow.register_backend: a backend written outside the package, chosen by name like any other."""

import json

import pytest
import torch
from conftest import ROOT, launch_ok

import paraflow
from paraflow.core import registry

PLUGINS = ROOT / "tests" / "core" / "plugins"


@pytest.fixture
def scratch_registry(monkeypatch):
    """Registrations made by a test vanish after it."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))


class LocalToy(paraflow.Backend):
    """The smallest backend: one process, collectives return the input."""

    MULTI_PROCESS = False
    LAUNCHERS = ("python",)

    def _init(self):
        pass

    def wrap_model(self, model):
        return model.to(self.device)

    def _allreduce(self, tensor, op):
        return tensor

    def _broadcast(self, tensor, src):
        return tensor

    def _allgather(self, tensor):
        return [tensor.clone()]


def test_registered_class_is_created_by_name_with_its_presets(scratch_registry):
    paraflow.register_backend("toy-local", LocalToy, description="test", timeout=7)
    assert "toy-local" in paraflow.registered_names()
    assert paraflow.available_backends()["toy-local"] is None
    with paraflow.init("toy-local") as backend:
        assert isinstance(backend, LocalToy) and backend.timeout == 7
        assert torch.equal(backend.allreduce(torch.ones(3), op="sum"), torch.ones(3))


def test_lazy_target_is_imported_only_when_used(scratch_registry):
    paraflow.register_backend("toy-lazy", "no_such_module_anywhere:Backend")
    assert "toy-lazy" in paraflow.registered_names()  # registering imports nothing
    assert "no_such_module_anywhere" in paraflow.available_backends()["toy-lazy"]


@pytest.mark.parametrize(
    "name, target, message",
    [
        ("", LocalToy, "non-empty word"),
        ("two words", LocalToy, "non-empty word"),
        ("toy", object, "paraflow.Backend subclass"),
        ("toy", "module_without_colon", "module:Class"),
        ("single", LocalToy, "already registered"),
    ],
)
def test_bad_registrations_are_refused_with_the_reason(scratch_registry, name, target, message):
    with pytest.raises(paraflow.ConfigurationError, match=message):
        paraflow.register_backend(name, target)


def test_replace_allows_a_new_class_under_an_existing_name(scratch_registry):
    paraflow.register_backend("single", LocalToy, replace=True)
    assert isinstance(paraflow.get_backend("single"), LocalToy)


def test_missing_class_in_module_names_the_registration(scratch_registry):
    paraflow.register_backend("toy-typo", "paraflow.backends.single:NoSuchClass")
    with pytest.raises(paraflow.ConfigurationError, match="toy-typo.*NoSuchClass"):
        paraflow.get_backend("toy-typo")


@pytest.mark.timeout(240)
def test_train_py_runs_on_a_backend_registered_outside_the_package(tmp_path):
    """Under torchrun, 2 ranks: the toy backend trains exactly as DDP does (same losses)."""
    args = ["--data", "digits", "--max-steps", "8", "--epochs", "1"]
    toy, ddp = tmp_path / "toy.json", tmp_path / "ddp.json"
    launch_ok("torchrun", 2, [PLUGINS / "train_with_toy.py", *args, "--json-out", toy], timeout=180)
    launch_ok("torchrun", 2, [ROOT / "train.py", "--backend", "ddp-gloo", *args, "--json-out", ddp], timeout=180)
    toy_run, ddp_run = json.loads(toy.read_text()), json.loads(ddp.read_text())
    assert toy_run["backend"] == "toy" and toy_run["world_size"] == 2 and toy_run["steps"] == 8
    assert toy_run["final_loss"] == pytest.approx(ddp_run["final_loss"], rel=1e-4)
    assert toy_run["accuracy"] == pytest.approx(ddp_run["accuracy"], abs=1e-3)


def test_every_backends_launchers_are_registered_launchers_named_as_the_backend_reports_them():
    from paraflow.environment.launchers import get_launcher, registered_launchers

    names = {launcher.name for launcher in registered_launchers()}
    for name in paraflow.available_backends():
        cls = registry.spec(name).load()
        assert set(cls.LAUNCHERS) <= names, (name, cls.LAUNCHERS)
        assert cls.launch_programs() == tuple(get_launcher(n).tool for n in cls.LAUNCHERS)
    horovod = registry.spec("horovod").load()
    assert horovod.LAUNCHERS == ("openmpi", "horovodrun") and horovod.launch_programs() == ("mpirun", "horovodrun")
