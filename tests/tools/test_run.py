"""`paraflow run`: the command printed for every launcher, real runs under each, exit codes, no orphans."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, requires_horovod

import paraflow
from paraflow.cli import main as cli
from paraflow.core.placement import cores
from paraflow.environment.launchers import free_port
from paraflow.tools.run import job_environment

PY = sys.executable
PROBE = str(Path(__file__).resolve().parent / "workers" / "probe.py")
ROOT_FLAG = " --allow-run-as-root" if os.geteuid() == 0 else ""
MPIRUN = "/usr/bin/mpirun"
HOROVODRUN = os.path.join(os.path.dirname(PY), "horovodrun")


def dry_run(capsys, *args) -> list:
    assert cli(["run", "--dry-run", *args]) == 0
    return capsys.readouterr().out.splitlines()


# ---------------------------------------------------------------- the printed commands
def test_single_and_dp_run_under_plain_python(capsys):
    assert dry_run(capsys, "--backend", "single", "train.py", "--epochs", "1") == [
        f"PARAFLOW_BACKEND=single {PY} train.py --epochs 1"
    ]
    assert dry_run(capsys, "--backend", "dp", "train.py") == [f"PARAFLOW_BACKEND=dp {PY} train.py"]


@pytest.mark.parametrize("backend", ["ddp-gloo", "ddp"])
def test_ddp_runs_under_torchrun_on_a_free_port(capsys, backend):
    (line,) = dry_run(capsys, "-n", "2", "--backend", backend, "train.py")
    assert re.fullmatch(
        rf"PARAFLOW_BACKEND={backend} {re.escape(PY)} -m torch.distributed.run --nnodes 1 --nproc_per_node 2 "
        rf"--master_addr 127.0.0.1 --master_port \d+ train.py",
        line,
    )


@pytest.mark.skipif(not os.path.exists(MPIRUN), reason="needs Open MPI's mpirun at /usr/bin")
def test_horovod_runs_under_mpirun_when_present(capsys):
    yield_flag = "OMPI_MCA_mpi_yield_when_idle=1 " if 2 >= cores() else ""
    assert dry_run(capsys, "-n", "2", "--backend", "horovod", "train.py") == [
        f"PARAFLOW_BACKEND=horovod {yield_flag}{MPIRUN} -np 2 --bind-to none --oversubscribe{ROOT_FLAG} {PY} train.py"
    ]


def test_horovod_falls_back_to_horovodrun_gloo_without_mpirun(capsys, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # no mpirun on PATH (horovodrun is next to this Python)
    if not os.access(HOROVODRUN, os.X_OK):
        pytest.skip("horovodrun is not installed next to this Python")
    assert dry_run(capsys, "-n", "2", "--backend", "horovod", "train.py") == [
        f"PARAFLOW_BACKEND=horovod {HOROVODRUN} -np 2 -H localhost:2 --gloo {PY} train.py"
    ]


def test_every_launcher_across_hosts(capsys):
    hosts = ["--hosts", "node1:2,node2:2"]
    assert dry_run(capsys, *hosts, "--backend", "ddp", "--port", "29400", "train.py") == [
        "# on node1",
        f"PARAFLOW_BACKEND=ddp {PY} -m torch.distributed.run --nnodes 2 --node_rank 0 --nproc_per_node 2 "
        "--rdzv_backend static --rdzv_endpoint node1:29400 train.py",
        "# on node2",
        f"PARAFLOW_BACKEND=ddp {PY} -m torch.distributed.run --nnodes 2 --node_rank 1 --nproc_per_node 2 "
        "--rdzv_backend static --rdzv_endpoint node1:29400 train.py",
    ]
    (line,) = dry_run(capsys, *hosts, "--backend", "horovod", "--launcher", "mpirun", "train.py")
    assert line.startswith("PARAFLOW_BACKEND=horovod ")
    assert line.endswith(
        f"mpirun -np 4 --bind-to none -H node1:2,node2:2{ROOT_FLAG} -x PARAFLOW_BACKEND {PY} train.py"
    )  # remote ranks get the backend from mpirun's -x
    assert "OMPI_MCA" not in line and "--oversubscribe" not in line
    (line,) = dry_run(capsys, *hosts, "--backend", "horovod", "--launcher", "horovodrun", "train.py")
    assert line.endswith(f"horovodrun -np 4 -H node1:2,node2:2 --gloo {PY} train.py")
    (line,) = dry_run(capsys, *hosts, "--backend", "ddp", "--launcher", "srun", "train.py")
    assert line.endswith(f"srun -n 4 --nodelist node1,node2 --ntasks-per-node 2 --kill-on-bad-exit=1 {PY} train.py")


def test_srun_is_picked_inside_a_slurm_allocation(capsys, monkeypatch, tmp_path):
    srun = tmp_path / "srun"  # only looked up, never started: a dry run
    srun.write_text("#!/bin/sh\nexit 99\n")
    srun.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert dry_run(capsys, "-n", "4", "--backend", "ddp", "train.py") == [
        f"PARAFLOW_BACKEND=ddp {srun} -n 4 --kill-on-bad-exit=1 {PY} train.py"
    ]
    # one-process backends stay on plain python inside an allocation too
    assert dry_run(capsys, "--backend", "single", "train.py") == [f"PARAFLOW_BACKEND=single {PY} train.py"]


@pytest.mark.parametrize(
    "args, words",
    [
        (["-n", "2", "--backend", "single"], "runs in one process"),
        (["-n", "3", "--hosts", "a:1,b:1", "--backend", "ddp"], "holds 2 processes"),
        (["--hosts", "a:1,b:2", "--backend", "ddp", "--launcher", "srun"], "same count"),
        (["--hosts", "a:0", "--backend", "ddp"], "HOST:PROCESSES"),
        (["-n", "2", "--backend", "nope"], "known backends: single"),
    ],
)
def test_bad_arguments_exit_2_with_the_reason(capsys, args, words):
    assert cli(["run", "--dry-run", *args, "train.py"]) == 2
    assert words in capsys.readouterr().err


class _NeverHere(paraflow.Backend):
    """A backend that can never run: what paraflow run must refuse before starting anything."""

    @classmethod
    def unavailable_reason(cls, **presets):
        return "it needs the moon's GPU"


@pytest.fixture
def never_here():
    from paraflow.core import registry

    paraflow.register_backend("never-here", _NeverHere)
    yield "never-here"
    registry._REGISTRY.pop("never-here")


def _refused(capsys, tmp_path, backend: str) -> str:
    started = tmp_path / "started"
    script = tmp_path / "x.py"
    script.write_text(f"open({str(started)!r}, 'w').close()\n")
    assert cli(["run", "-n", "2", "--backend", backend, str(script)]) == 2
    captured = capsys.readouterr()
    assert not started.exists()  # no process ran the script
    assert "paraflow run:" not in captured.out  # no command was started
    return captured.err


def test_a_backend_that_cannot_run_here_is_refused_before_any_process_starts(capsys, tmp_path, never_here):
    err = _refused(capsys, tmp_path, never_here)
    assert "backend 'never-here' cannot run here, so no process was started: it needs the moon's GPU" in err
    assert cli(["run", "--dry-run", "-n", "2", "--backend", never_here, "x.py"]) == 0  # a dry run still prints


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: ddp-nccl can run here")
def test_ddp_nccl_without_a_gpu_is_refused_with_the_reason_paraflow_backends_gives(capsys, tmp_path):
    assert cli(["backends"]) == 0
    (listed,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("ddp-nccl ")]
    reason = listed.split("unavailable: ", 1)[1]
    assert reason in _refused(capsys, tmp_path, "ddp-nccl")


def test_the_backend_reaches_the_script_as_paraflow_backend_and_the_default_follows_the_environment():
    from paraflow.tools.run import plan_run

    assert plan_run(["x.py"], 2, "ddp-gloo", must_exist=False, env={}).env["PARAFLOW_BACKEND"] == "ddp-gloo"
    assert (
        plan_run(["x.py"], 2, None, must_exist=False, env={"PARAFLOW_BACKEND": "fsdp"}).env["PARAFLOW_BACKEND"]
        == "fsdp"
    )
    assert plan_run(["x.py"], 1, None, must_exist=False, env={}).env["PARAFLOW_BACKEND"] == "single"


def test_the_old_timeout_flag_runs_as_the_new_one_with_a_note(capsys):
    from paraflow.cli import build_parser

    old = build_parser().parse_args(["run", "--timeout", "5", "train.py"])
    assert "paraflow run: note: --timeout was renamed: use --job-timeout" in capsys.readouterr().err
    assert vars(old) == vars(build_parser().parse_args(["run", "--job-timeout", "5", "train.py"]))


def test_a_parent_jobs_rank_variables_are_not_passed_on():
    env = {"RANK": "3", "WORLD_SIZE": "8", "SLURM_PROCID": "1", "SLURM_JOB_ID": "7", "PARAFLOW_RANK": "1", "HOME": "/"}
    changes = job_environment("torchrun", 2, env)
    assert changes == {"RANK": None, "WORLD_SIZE": None, "SLURM_PROCID": None, "PARAFLOW_RANK": None}


# ---------------------------------------------------------------- real runs


def paraflow_run(env, *args, timeout=240):
    cmd = [PY, "-m", "paraflow.cli", "run", *map(str, args)]
    return subprocess.run(cmd, env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=timeout)


TRAIN = ["train.py", "--epochs", "1", "--max-steps", "2", "--data", "synthetic", "--model", "mlp"]


@pytest.mark.parametrize(
    "backend, launcher, shown",
    [
        ("ddp-gloo", "auto", "torch.distributed.run"),
        pytest.param("horovod", "auto", "mpirun", marks=requires_horovod),
        pytest.param("horovod", "horovodrun", "horovodrun", marks=requires_horovod),
    ],
)
def test_train_py_runs_on_two_ranks(no_leftovers, tmp_path, backend, launcher, shown):
    out = tmp_path / "summary.json"
    done = paraflow_run(no_leftovers, "-n", 2, "--backend", backend, "--launcher", launcher, *TRAIN, "--json-out", out)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    first = done.stdout.splitlines()[0]
    assert first.startswith(f"paraflow run: PARAFLOW_BACKEND={backend} ") and shown in first
    assert "--backend" not in first.split(" train.py", 1)[1]  # the script is handed nothing to parse
    summary = json.loads(out.read_text())  # train.py's paraflow.init(None) took the backend from the variable
    assert (summary["backend"], summary["world_size"]) == (backend, 2)


def test_the_jobs_exit_status_is_returned(no_leftovers):
    assert paraflow_run(no_leftovers, "-n", 2, "--launcher", "mpirun", PROBE, "exit", 5).returncode == 5


def test_a_killed_rank_ends_the_run_with_every_process_gone(no_leftovers, tmp_path):
    done = paraflow_run(no_leftovers, "-n", 2, "--backend", "ddp-gloo", PROBE, "kill", 1, tmp_path)
    assert done.returncode != 0
    assert sorted(p.name for p in tmp_path.glob("started*")) == ["started0", "started1"]


def test_ctrl_c_kills_every_process_it_started(no_leftovers, tmp_path):
    """SIGINT as a terminal's Ctrl-C sends it.

    A process started with SIGINT ignored keeps ignoring it (so does Python): a background job of
    a script (``pytest &``) is started that way, so the command gets SIGINT's default action back.
    """
    cmd = [PY, "-m", "paraflow.cli", "run", "-n", "2", "--backend", "ddp-gloo", PROBE, "sleep", str(tmp_path)]
    proc = subprocess.Popen(
        cmd,
        env=no_leftovers,
        cwd=str(ROOT),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 180
    while len(list(tmp_path.glob("started*"))) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert len(list(tmp_path.glob("started*"))) == 2, proc.communicate(timeout=60)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "SIGINT: every process of the job was killed" in err
    assert not any(running(int(p.read_text())) for p in tmp_path.glob("started*"))


def running(pid: int) -> bool:
    """True while `pid` runs (a zombie has exited: only its parent's bookkeeping is left)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_torchrun_across_two_hosts_forms_one_job(no_leftovers, tmp_path):
    """Both "hosts" are this one (two loopback names): each agent starts its share, ranks 0 and 1."""
    hosts, port = "127.0.0.1:1,localhost:1", str(free_port())
    agents = [
        subprocess.Popen(
            [PY, "-m", "paraflow.cli", "run", "--hosts", hosts, "--node-rank", str(node), "--port", port]
            + ["--backend", "ddp-gloo", PROBE, "identity", str(tmp_path)],
            env=no_leftovers,
            cwd=str(ROOT),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in (0, 1)
    ]
    results = [agent.communicate(timeout=240) for agent in agents]
    assert [a.returncode for a in agents] == [0, 0], results
    ranks = sorted((json.loads(p.read_text()) for p in tmp_path.glob("rank*.json")), key=lambda r: r["RANK"])
    assert [(r["RANK"], r["WORLD_SIZE"], r["GROUP_RANK"]) for r in ranks] == [("0", "2", "0"), ("1", "2", "1")]
    assert [r["PARAFLOW_BACKEND"] for r in ranks] == ["ddp-gloo", "ddp-gloo"]
    assert "--node_rank 1" in results[1][0].splitlines()[0]
