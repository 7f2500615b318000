"""Sharded checkpoints under real launchers: a rank killed mid-save, asynchronous saves, and resuming
across backends and world sizes (the sharded directory itself under ddp-gloo, horovod and single),
each ending where the uninterrupted run ends (float64, AdamW).

Every run trains the same global batches whatever its rank count (tests/backends/fsdp/workers/steps.py),
so the references are one uninterrupted `single` run.
"""

import json
from pathlib import Path

import pytest
import torch
from conftest import launch, launch_ok, requires_horovod

STEPS = Path(__file__).resolve().parent / "workers" / "steps.py"
TOTAL, HALF = 6, 3
LAUNCHER = {"single": "python", "ddp-gloo": "torchrun", "fsdp": "torchrun", "horovod": "mpirun"}


def run(directory, backend, nproc, name, *args, ok=True):
    out = directory / f"{name}.pt"
    argv = [STEPS, backend, out, TOTAL, *args]
    (launch_ok if ok else launch)(LAUNCHER[backend], nproc, argv, timeout=150)
    return out


def final(out):
    return torch.load(out, weights_only=True)["state"]


def resumed_from(out):
    return json.loads(Path(f"{out}.json").read_text())["resumed_from"]


def assert_same_state(a, b):
    """Model and AdamW state equal to float64 round-off (ranks sum in another order than one process)."""
    assert a["progress"] == b["progress"]
    for key in a["model"]:
        torch.testing.assert_close(a["model"][key], b["model"][key], rtol=1e-10, atol=1e-12, msg=key)
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
    for index, moments in a["optimizer"]["state"].items():
        for name, value in moments.items():
            torch.testing.assert_close(value, b["optimizer"]["state"][index][name], rtol=1e-10, atol=1e-12)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Lazily: the uninterrupted reference, and the checkpoint each writer leaves half-way.

    Writers: "ddp-gloo" (a full file), "fsdp" (sharded, plus the full export), "fsdp-async"
    (sharded with async_save, training going on while it is written).
    """
    directory = tmp_path_factory.mktemp("fsdp-resume")
    cache = {}

    def get(kind):
        if kind not in cache:
            if kind == "straight":
                cache[kind] = final(run(directory, "single", 1, "straight"))
            elif kind == "straight-ddp-gloo":
                cache[kind] = final(run(directory, "ddp-gloo", 2, "straight-ddp-gloo"))
            else:
                ckpt = directory / f"{kind}-half"
                args = [f"save_at={HALF}", f"ckpt={ckpt}"]
                if kind == "fsdp-async":
                    args += ["export_at_save=0", "options=async_save:1"]
                run(directory, kind.split("-async")[0], 2, f"{kind}-writer", *args)
                cache[kind] = ckpt
        return cache[kind]

    return get


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "writer, source, reader, nproc",
    [
        ("fsdp", ".full.pt", "ddp-gloo", 2),  # ddp reads fsdp's full export
        ("ddp-gloo", "", "fsdp", 2),  # fsdp reads ddp's own file
        ("fsdp", "", "fsdp", 1),  # the sharded directory, resharded onto 1 rank
        ("fsdp-async", "", "fsdp", 3),  # one written asynchronously, resharded onto 3 ranks
    ],
    ids=["fsdp-to-ddp", "ddp-to-fsdp", "fsdp2-to-fsdp1", "fsdp2-async-to-fsdp3"],
)
def test_resume_ends_where_the_uninterrupted_run_ends(tmp_path, runs, writer, source, reader, nproc):
    checkpoint = runs(writer)
    out = run(tmp_path, reader, nproc, "resumed", f"resume={checkpoint}{source}")
    assert resumed_from(out) == HALF
    straight = runs("straight")
    assert_same_state(final(out), straight)
    # Guard: the second half trained (a resume that did nothing, or restarted, would not match anyway).
    assert not torch.equal(final(out)["model"]["net.1.weight"], _initial()["net.1.weight"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "reader, nproc",
    [("ddp-gloo", 2), pytest.param("horovod", 2, marks=requires_horovod), ("single", 1)],
    ids=["fsdp2-to-ddp-gloo2", "fsdp2-to-horovod2", "fsdp2-to-single"],
)
def test_the_sharded_directory_resumes_under_every_other_backend(tmp_path, runs, reader, nproc):
    """No export needed: ddp, horovod and single read fsdp's shards whole and end where ddp-gloo ends."""
    out = run(tmp_path, reader, nproc, "resumed", f"resume={runs('fsdp')}")
    assert resumed_from(out) == HALF
    assert_same_state(final(out), runs("straight-ddp-gloo"))
    assert not torch.equal(final(out)["model"]["net.1.weight"], _initial()["net.1.weight"])


def _initial():
    from paraflow.examples.models import build_model

    torch.manual_seed(1234)
    return build_model("mlp", width=16).double().state_dict()


@pytest.mark.timeout(300)
def test_a_rank_killed_in_a_later_save_leaves_the_earlier_checkpoint_loadable(tmp_path, runs):
    ckpt = tmp_path / "ckpt"
    killed = run(tmp_path, "fsdp", 2, "killed", "save_at=2,4", f"ckpt={ckpt}", "kill_rank=1", ok=False)
    assert not killed.exists(), "the run was meant to die in its second save"
    versions = sorted(p.name for p in ckpt.iterdir() if p.is_dir())
    committed = (ckpt / "current").read_text()
    assert len(versions) == 2 and committed in versions  # the half-written version is still there
    partial = next(v for v in versions if v != committed)
    assert not (ckpt / partial / ".metadata").exists()

    out = run(tmp_path, "fsdp", 2, "after-kill", f"resume={ckpt}", f"save_at={TOTAL}", f"ckpt={ckpt}")
    assert resumed_from(out) == 2  # the earlier checkpoint, not the killed one
    assert_same_state(final(out), runs("straight"))
    assert not (ckpt / partial).exists()  # removed by the next committed save
