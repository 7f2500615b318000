"""The porting guide's examples (docs/examples/porting_*.py) run as the guide says, and each port
trains what the script it ports trains."""

import re

import pytest
from conftest import ROOT, launch_ok, requires_horovod

EXAMPLES = ROOT / "docs" / "examples"


def weights_sum(result) -> float:
    found = re.findall(r"weights sum (-?\d+\.\d+)", result.stdout)
    assert len(found) == 1, f"expected one 'weights sum' line from rank 0:\n{result.stdout}\n{result.stderr[-3000:]}"
    return float(found[0])


def run(launcher, nproc, name, *args, backend=None):
    env = {"PARAFLOW_BACKEND": backend} if backend else {}
    return launch_ok(launcher, nproc, [EXAMPLES / name, *args], timeout=180, env=env)


@pytest.mark.timeout(400)
def test_the_mp_spawn_ddp_script_and_its_port_train_the_same_model(straight):
    before = weights_sum(run("python", 1, "porting_ddp_before.py"))
    spawned = weights_sum(run("python", 1, "porting_ddp_after.py", "--spawn", "2", "--backend", "ddp-gloo"))
    assert spawned == straight  # paraflow.launch, as torchrun
    assert spawned == pytest.approx(before, rel=1e-7)  # clipping's norm is summed in float64 here


@pytest.fixture(scope="module")
def straight():
    """The uninterrupted run of porting_ddp_after.py under ddp-gloo."""
    return weights_sum(run("torchrun", 2, "porting_ddp_after.py", backend="ddp-gloo"))


@pytest.mark.timeout(400)
@pytest.mark.parametrize("reader", ["ddp-gloo", pytest.param("horovod", marks=requires_horovod)])
def test_a_run_stopped_under_fsdp_resumes_under_another_backend(tmp_path, straight, reader):
    checkpoint = str(tmp_path / "ckpt")
    stopped = run(
        "torchrun", 2, "porting_ddp_after.py", "--checkpoint", checkpoint, "--stop-after", "4", backend="fsdp"
    )
    assert "saved at step 4 under fsdp" in stopped.stdout
    launcher = "mpirun" if reader == "horovod" else "torchrun"
    resumed = run(launcher, 2, "porting_ddp_after.py", "--checkpoint", checkpoint, backend=reader)
    assert f"resumed at step 4 under {reader}" in resumed.stdout
    assert weights_sum(resumed) == straight


@requires_horovod
@pytest.mark.timeout(400)
def test_the_horovod_script_and_its_port_train_the_same_model_on_every_backend():
    before = weights_sum(run("mpirun", 2, "porting_horovod_before.py"))
    on_horovod = weights_sum(run("mpirun", 2, "porting_horovod_after.py", backend="horovod"))
    on_ddp = weights_sum(run("torchrun", 2, "porting_horovod_after.py", backend="ddp-gloo"))
    on_fsdp = weights_sum(run("torchrun", 2, "porting_horovod_after.py", backend="fsdp"))
    assert on_horovod == on_ddp == on_fsdp
    assert on_horovod == pytest.approx(before, rel=1e-7)


@pytest.mark.timeout(400)
def test_the_module_list_model_shards_per_block_under_fsdp_and_trains_as_on_ddp():
    fsdp = run("torchrun", 2, "porting_module_list.py", backend="fsdp")
    assert "sharded blocks: h.0, h.1, h.2, h.3" in fsdp.stdout
    ddp = run("torchrun", 2, "porting_module_list.py", backend="ddp-gloo")
    losses = [re.findall(r"last loss (\S+)", r.stdout) for r in (fsdp, ddp)]
    assert losses[0] == losses[1] and len(losses[0]) == 1, losses
