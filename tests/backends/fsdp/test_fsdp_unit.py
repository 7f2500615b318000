"""fsdp in this process (a one-rank gloo group): options, block choice, the optimizer rebuild, refusals,
and the sharded checkpoint's layout and errors. The multi-rank behaviour is in the other files here."""

import os
import sys

import pytest
import torch
from torch import nn

import paraflow
from paraflow.backends.fsdp.backend import FSDPBackend
from paraflow.backends.fsdp.wrap import choose_blocks, mixed_precision_policy
from paraflow.errors import CheckpointError, ConfigurationError
from paraflow.examples.models import build_model


@pytest.fixture
def backend():
    with paraflow.init("fsdp", num_threads=1) as b:
        yield b


def two_groups(model):
    """SGD over two param groups with different hyperparameters (weights / biases)."""
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return torch.optim.SGD(
        [
            {"params": weights, "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4, "nesterov": True},
            {"params": biases, "lr": 0.01, "momentum": 0.5, "weight_decay": 0.0},
        ],
        lr=0.5,
    )


def hyperparameters(optimizer):
    return [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]


# ----------------------------------------------------------------- options and block choice
@pytest.mark.parametrize(
    "options, words",
    [
        ({"blocks": 3}, "blocks must name module classes"),
        ({"min_block_params": 0}, "min_block_params must be an integer >= 1"),
        ({"blocks": "Linear", "min_block_params": 10}, "not both"),
        ({"reshard_after_forward": "yes"}, "reshard_after_forward"),
        ({"async_save": "no"}, "async_save must be True or False"),
        ({"bucket_cap": 25}, "does not take option(s) bucket_cap, and no registered backend does"),
    ],
)
def test_bad_options_fail_at_construction(options, words):
    with pytest.raises(ConfigurationError, match=words.replace("(", r"\(").replace(")", r"\)")):
        paraflow.get_backend("fsdp", **options)


def test_default_blocks_of_the_example_models():
    mlp = build_model("mlp", width=1024)  # 66 k, 1.05 M and 10 k parameters per layer
    assert [m for m in choose_blocks(mlp, None, 50_000)] == [mlp.net[1], mlp.net[3]]
    transformer = build_model("transformer")  # layers of ~50 k: transformer layers are blocks anyway
    assert choose_blocks(transformer, None, 50_000) == list(transformer.encoder.layers)
    assert choose_blocks(build_model("cnn"), None, 50_000) == []  # 20 k parameters: the root alone


def test_blocks_named_by_class_and_unknown_classes_listed():
    model = build_model("mlp", width=16)
    assert choose_blocks(model, ("Linear",), 1) == [model.net[1], model.net[3], model.net[5]]
    assert choose_blocks(model, (), 1) == []
    with pytest.raises(ConfigurationError, match="Conv2d, not found in this MLP; its module classes are: .*Linear"):
        choose_blocks(model, ("Conv2d",), 1)


def test_precision_and_compression_become_the_mixed_precision_policy():
    computed = mixed_precision_policy("bf16", "none", torch.float32)
    assert (computed.param_dtype, computed.reduce_dtype) == (torch.bfloat16, torch.float32)
    compressed = mixed_precision_policy("fp32", "fp16", torch.float32)
    assert (compressed.param_dtype, compressed.reduce_dtype) == (None, torch.float16)
    plain = mixed_precision_policy("fp32", "none", torch.float64)
    assert (plain.param_dtype, plain.reduce_dtype) == (None, None)


def test_precision_computes_in_16_bits_on_float32_shards():
    seen = []
    with paraflow.init("fsdp", num_threads=1, precision="bf16") as b:
        model = b.wrap_model(build_model("mlp", width=16))
        optimizer = b.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
        model.net[1].register_forward_hook(lambda m, i, o: seen.append((m.weight.dtype, o.dtype)))
        with b.autocast():
            loss = torch.nn.functional.cross_entropy(model(torch.randn(4, 1, 8, 8)), torch.tensor([0, 1, 2, 3]))
        loss.backward()
        optimizer.step()
        assert seen == [(torch.bfloat16, torch.bfloat16)]
        assert {p.dtype for p in optimizer.param_groups[0]["params"]} == {torch.float32}
        assert {p.grad.dtype for p in optimizer.param_groups[0]["params"]} == {torch.float32}


def test_unavailable_without_numpy_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "numpy", None)  # import numpy now raises ImportError
    assert "pip install 'paraflow[fsdp]'" in FSDPBackend.unavailable_reason()


# ----------------------------------------------------------------- wrapping and the optimizer
def test_wrap_model_shards_each_block_then_the_root():
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    with paraflow.init("fsdp", num_threads=1, blocks="Linear") as b:
        wrapped = b.wrap_model(build_model("mlp", width=16))
        assert wrapped.paraflow_blocks == ["net.1", "net.3", "net.5"]
        assert isinstance(wrapped, FSDPModule) and all(isinstance(wrapped.net[i], FSDPModule) for i in (1, 3, 5))
        assert all(isinstance(p, DTensor) for p in wrapped.parameters())
        assert b.unwrap(wrapped) is wrapped
        with pytest.raises(ConfigurationError, match="already sharded"):
            b.wrap_model(wrapped)


def test_rebuilt_optimizer_keeps_class_groups_and_every_hyperparameter(backend):
    model = build_model("mlp", width=16)
    before = two_groups(model)
    wanted = hyperparameters(before)
    names = [[n for n, p in model.named_parameters() if any(p is q for q in g["params"])] for g in before.param_groups]
    model = backend.wrap_model(model)
    after = backend.wrap_optimizer(before, model)
    assert after is not before and type(after) is torch.optim.SGD
    assert hyperparameters(after) == wanted
    sharded = dict(model.named_parameters())
    assert [[id(p) for p in g["params"]] for g in after.param_groups] == [[id(sharded[n]) for n in g] for g in names]

    # The reason for the rebuild: the old optimizer steps tensors the model no longer uses.
    x, y = torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 3])
    start = {n: p.full_tensor().clone() for n, p in model.named_parameters()}
    torch.nn.functional.cross_entropy(model(x), y).backward()
    before.step()
    assert all(torch.equal(start[n], p.full_tensor()) for n, p in model.named_parameters())
    after.step()
    assert all(not torch.equal(start[n], p.full_tensor()) for n, p in model.named_parameters())


def test_adam_betas_and_an_optimizer_built_after_wrapping(backend):
    model = build_model("mlp", width=16)
    adam = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.8, 0.95), weight_decay=0.05, amsgrad=True)
    wanted = hyperparameters(adam)
    model = backend.wrap_model(model)
    assert hyperparameters(backend.wrap_optimizer(adam, model)) == wanted
    late = torch.optim.SGD(model.parameters(), lr=0.1)
    assert backend.wrap_optimizer(late, model) is late
    assert backend.wrap_optimizer(late) is late


class NeedsScale(torch.optim.SGD):
    """An optimizer whose constructor takes an argument its defaults do not hold."""

    def __init__(self, params, scale, lr=0.1):
        super().__init__(params, lr=lr * scale)


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda m: NeedsScale(m.parameters(), 2.0), "cannot rebuild the NeedsScale"),
        (lambda m: _stepped(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), m), "already has state"),
        (lambda m: _scheduled(torch.optim.SGD(m.parameters(), lr=0.1)), "learning-rate scheduler"),
        (lambda m: torch.optim.SGD([nn.Parameter(torch.zeros(3))], lr=0.1), "not the model's"),
    ],
    ids=["constructor", "state", "scheduler", "foreign-parameters"],
)
def test_optimizers_that_cannot_be_rebuilt_are_refused_with_the_fix(backend, make, words):
    model = build_model("mlp", width=16)
    optimizer = make(model)
    model = backend.wrap_model(model)
    with pytest.raises(ConfigurationError, match=words) as info:
        backend.wrap_optimizer(optimizer, model)
    assert "build it after wrap_model" in str(info.value) or "pass the model" in str(info.value)


def test_wrap_optimizer_finds_the_model_it_was_built_for(backend):
    first, second = build_model("mlp", width=16), build_model("mlp", width=16)
    optimizer = torch.optim.SGD(first.parameters(), lr=0.1, momentum=0.9)
    mixed = torch.optim.SGD([*first.parameters(), *second.parameters()], lr=0.1)
    first, second = backend.wrap_model(first), backend.wrap_model(second)
    rebuilt = backend.wrap_optimizer(optimizer)  # no model: the one its parameters came from
    assert [id(p) for p in rebuilt.param_groups[0]["params"]] == [id(p) for p in first.parameters()]
    with pytest.raises(ConfigurationError, match=r"backend.wrap_optimizer\(optimizer, model\)"):
        backend.wrap_optimizer(mixed)  # parameters of two models: which one is meant is unclear
    with pytest.raises(ConfigurationError, match="6 parameter.s. that are not the model's"):
        backend.wrap_optimizer(mixed, first)  # the second model's are not renamed onto the first's


def _stepped(optimizer, model):
    model(torch.randn(2, 1, 8, 8)).sum().backward()
    optimizer.step()
    return optimizer


def _scheduled(optimizer):
    torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    return optimizer


def test_join_is_refused_with_drop_last_and_no_sync_needs_the_wrapped_model(backend):
    model = backend.wrap_model(build_model("mlp", width=16))
    with pytest.raises(ConfigurationError, match=r"drop_last=True\) \(train.py --drop-last\)"):
        backend.join(model)
    with backend.join(model, enable=False):
        pass
    with pytest.raises(ConfigurationError, match="model returned by wrap_model"):
        backend.no_sync(build_model("mlp", width=16))


# ----------------------------------------------------------------- checkpoint layout and errors
def test_sharded_checkpoint_round_trip_layout_and_commit(backend, tmp_path):
    model = backend.wrap_model(build_model("mlp", width=16))
    optimizer = backend.wrap_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-2), model)
    _stepped(optimizer, model)
    path = tmp_path / "ckpt"
    backend.save(str(path), {"model": model, "optimizer": optimizer, "epoch": 3})
    first = (path / "current").read_text()
    assert sorted(os.listdir(path / first)) == [".metadata", "__0_0.distcp", "paraflow.pt"]
    saved = {n: p.full_tensor().clone() for n, p in model.named_parameters()}
    saved_step = optimizer.state_dict()["state"][0]["step"].clone()
    _stepped(optimizer, model)
    state = {"model": model, "optimizer": optimizer, "epoch": 0}
    backend.load(str(path), state)
    assert state["epoch"] == 3 and torch.equal(optimizer.state_dict()["state"][0]["step"], saved_step)
    assert all(torch.equal(saved[n], p.full_tensor()) for n, p in model.named_parameters())

    backend.save(str(path), state)
    second = (path / "current").read_text()
    assert second != first and sorted(os.listdir(path)) == sorted(["current", second])  # the old version removed
    with pytest.raises(ConfigurationError, match="has no entry 'missing'"):
        backend.load(str(path), {**state, "missing": 1})
    (path / "current").write_text(first)  # points at a version that is gone
    with pytest.raises(CheckpointError, match="could not read sharded checkpoint"):
        backend.load(str(path), state)


def test_sharded_checkpoint_errors_name_the_fix(backend, tmp_path):
    model = backend.wrap_model(build_model("mlp", width=16))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no committed sharded checkpoint"):
        backend.load(str(tmp_path / "empty"), {"model": model})
    (tmp_path / "file.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"backend.export\(path, state\)"):
        backend.save(str(tmp_path / "file.pt"), {"model": model})


def test_single_reads_a_sharded_checkpoint_whole(tmp_path):
    """One process, no process group: fsdp's directory loads as the full file would."""
    path = str(tmp_path / "ckpt")
    with paraflow.init("fsdp", num_threads=1, blocks="Linear") as fsdp:
        model = fsdp.wrap_model(build_model("mlp", width=16))
        optimizer = fsdp.wrap_optimizer(torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.8, 0.9)), model)
        _stepped(optimizer, model)
        state = {"model": model, "optimizer": optimizer, "epoch": 3}
        fsdp.save(path, state)
        fsdp.export(path + ".full.pt", state)
    with paraflow.init("single", num_threads=1) as single:
        (tmp_path / "empty").mkdir()
        with pytest.raises(CheckpointError, match="no committed sharded checkpoint"):
            single.load(str(tmp_path / "empty"))
        loaded = {}
        for source in (path, path + ".full.pt"):
            model = single.wrap_model(build_model("mlp", width=16))
            optimizer = single.wrap_optimizer(torch.optim.AdamW(model.parameters(), lr=0.5), model)
            state = {"model": model, "optimizer": optimizer, "epoch": 0}
            assert single.load(source, state) == {"epoch": 3}
            assert state["epoch"] == 3 and optimizer.param_groups[0]["betas"] == (0.8, 0.9)
            loaded[source] = (model.state_dict(), optimizer.state_dict())
    (sharded_model, sharded_opt), (full_model, full_opt) = loaded.values()
    assert all(torch.equal(sharded_model[k], full_model[k]) for k in full_model)
    assert sharded_opt["param_groups"] == full_opt["param_groups"]
    for index, moments in full_opt["state"].items():
        assert all(torch.equal(value, sharded_opt["state"][index][name]) for name, value in moments.items())


@pytest.mark.parametrize("asynchronous", [False, True], ids=["save", "async_save"])
def test_a_failed_save_is_reported_and_keeps_the_committed_one(tmp_path, monkeypatch, asynchronous):
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    with paraflow.init("fsdp", num_threads=1, async_save=asynchronous) as b:
        model = b.wrap_model(build_model("mlp", width=16))
        path = tmp_path / "ckpt"
        b.save(str(path), {"model": model})
        b.wait_for_checkpoint()
        committed = (path / "current").read_text()

        def full_disk(self, plan, planner):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(FileSystemWriter, "write_data", full_disk)
        with pytest.raises(CheckpointError, match="rank 0: OSError: .*No space left on device; the previously"):
            b.save(str(path), {"model": model})  # asynchronous: returns, the write fails in the background
            b.wait_for_checkpoint()
        assert (path / "current").read_text() == committed
        monkeypatch.undo()
        b.load(str(path), {"model": model})
