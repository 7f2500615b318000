"""`--model MODULE:FUNCTION[:key=value]`: your own model in the benchmark, built by a factory."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from paraflow.bench.driver.config import BenchConfig
from paraflow.bench.model_spec import ModelSpec
from paraflow.bench.rank.factory import batch_samples, build_factory, call_model, check_factory, take
from paraflow.bench.rank.train_loop import make_step
from paraflow.errors import ConfigurationError

FACTORIES = Path(__file__).resolve().parent / "factories"


@pytest.fixture(autouse=True)
def _factories_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(FACTORIES))


def spec(text: str) -> ModelSpec:
    return ModelSpec.parse(text)


def test_specs_parse_builtins_factories_and_scripts():
    assert spec("mlp:width=16") == ModelSpec("mlp", (("width", 16),))
    s = spec("pkg.models:build:hidden=40,depth=2")
    assert (s.kind, s.name, s.kwargs) == ("factory", "pkg.models:build", {"hidden": "40", "depth": "2"})
    assert str(s) == "pkg.models:build:hidden=40,depth=2" and s.label == "pkg.models:build(hidden=40,depth=2)"
    assert spec(str(s)) == s
    script = spec("script::runs/train.py")
    assert script.kind == "script" and script.label == "train.py" and spec(str(script)) == script
    with pytest.raises(ConfigurationError, match="built-in one .*MODULE:FUNCTION"):
        spec("resnet")
    with pytest.raises(ConfigurationError, match="not key=<value>"):
        spec("pkg.models:build:hidden")


def test_a_pair_factory_gives_its_batch_and_cross_entropy_for_integer_targets():
    built = build_factory(spec("bench_factories:pair:hidden=7"), None, 10, batch_size=32)
    assert batch_samples(built.inputs) == 8 and built.targets.dtype == torch.int64
    loss = built.loss(call_model(built.module, built.inputs), built.targets)
    assert loss.item() == pytest.approx(
        torch.nn.functional.cross_entropy(built.module(built.inputs), built.targets).item()
    )
    assert built.module[1].out_features == 7  # the option arrived (as a string, converted by the factory)


def test_float_targets_get_mean_squared_error():
    built = build_factory(spec("bench_factories:regression"), None, 10, batch_size=32)
    out = call_model(built.module, built.inputs)
    assert built.loss(out, built.targets).item() == pytest.approx(
        torch.nn.functional.mse_loss(out, built.targets).item()
    )


def test_a_bare_module_gets_a_synthetic_batch_of_input_shape_and_classes():
    built = build_factory(spec("bench_factories:bare:width=3"), (3, 6, 6), 5, batch_size=4)
    assert built.inputs.shape == (4, 3, 6, 6) and built.targets.max() < 5 and batch_samples(built.inputs) == 4
    facts = check_factory(spec("bench_factories:bare:width=3"), (3, 6, 6), 5)
    assert facts["parameters"] == sum(p.numel() for p in built.module.parameters())
    assert facts["param_bytes"] == 4 * facts["parameters"]
    assert facts["grad_bytes"] == facts["param_bytes"]  # every parameter trains


@pytest.mark.parametrize(
    "text, shape, message",
    [
        ("bench_factories:broken", None, r"bench_factories:broken\(\) raised RuntimeError: no weights here"),
        ("bench_factories:wrong_type", None, "returned str; a factory returns an nn.Module .* or \\(model, "),
        ("bench_factories:bare", None, "returns a bare nn.Module: give one sample's shape .*--input-shape"),
        ("no_such_module_here:build", None, "no module named 'no_such_module_here' here"),
        ("bench_factories:nope", None, "has no function 'nope'; it has .*pair"),
        ("bench_factories:bare", (3, 5), "a forward pass and its loss .*check --input-shape"),
    ],
)
def test_a_factory_that_cannot_build_is_a_clear_error(text, shape, message):
    with pytest.raises(ConfigurationError, match=message):
        check_factory(spec(text), shape, 5)


def test_strong_scaling_takes_this_ranks_share_of_the_batch():
    x, y = torch.arange(8).view(8, 1), torch.arange(8)
    (part, labels) = take({"x": x}, y, 1, 2)
    assert part["x"].flatten().tolist() == [4, 5, 6, 7] and labels.tolist() == [4, 5, 6, 7]
    with pytest.raises(ConfigurationError, match="does not divide"):
        take(x, y, 0, 3)


def test_a_gpt2_from_a_config_trains_a_step():
    pytest.importorskip("transformers", reason="the GPT-2 example needs transformers (pip install transformers)")
    built = build_factory(spec("bench_factories:gpt2:layers=2"), None, 10, batch_size=2)
    assert batch_samples(built.inputs) == 2
    assert check_factory(spec("bench_factories:gpt2:layers=2"), None, 10)["parameters"] > 0
    optimizer = torch.optim.SGD(built.module.parameters(), lr=0.01)
    step = make_step(built.module, optimizer, torch.device("cpu"), loss_fn=built.loss)
    first = float(step(built.inputs, built.targets))
    assert first > 0 and all(float(step(built.inputs, built.targets)) < first for _ in range(1))


def test_the_tests_never_import_torchvision():
    assert "torchvision" not in sys.modules


def test_ranks_get_the_shape_classes_and_the_current_directory(tmp_path, monkeypatch):
    from paraflow.bench.driver.matrix import Cell
    from paraflow.bench.driver.runner import cell_env, worker_args

    config = BenchConfig(models=["bench_factories:bare"], input_shape=(3, 8, 8), classes=5, plots=False)
    cell = Cell("train", "ddp-gloo", "torchrun", 2, 1, tuple(config.models))
    task = json.loads(worker_args(cell, config, tmp_path)[3])
    assert task["input_shape"] == [3, 8, 8] and task["classes"] == 5 and task["models"] == ["bench_factories:bare"]
    monkeypatch.chdir(tmp_path)
    assert str(tmp_path) in cell_env(cell, timeout=60)["PYTHONPATH"].split(":")
