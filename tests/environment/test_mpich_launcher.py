"""MPICH's launcher (Hydra's mpiexec, from the `mpich` wheel on PyPI): who each rank is, and train.py on it.

Hydra sets PMI_RANK, PMI_SIZE, MPI_LOCALRANKID and MPI_LOCALNRANKS. The MPICH used is the one
in this environment when it has one (a `PARAFLOW_MPI=pypi` install), else the `mpich` wheel
installed with ``pip --prefix`` into a directory of this module's (skipped with the reason when
PyPI cannot be reached); mpi4py's binary wheel is pointed at its library with MPI4PY_LIBMPI.
horovod runs with its MPI controller when it was built against MPICH; a horovod built against
another MPI cannot share Hydra's MPI world, so it runs with its gloo controller, rank 0's
address passed with ``-genv`` as for any MPI without mpi4py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import RANK_ENV, ROOT, WORKERS, requires_horovod
from trainkit import assert_same_parameters, exported_parameters, single_reference, train_args

from paraflow.environment.launchers import free_port
from paraflow.environment.mpi_library import launcher_family, linked_library, mpi_family
from paraflow.tools.launch import find_tool, run_launch

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def mpich(tmp_path_factory) -> dict:
    """``{"mpiexec": path, "env": variables every rank needs}`` for a PyPI MPICH."""
    own = find_tool("mpiexec")
    if own and Path(own).parent == Path(sys.executable).parent and launcher_family(own) == "mpich":
        return {"mpiexec": own, "env": {}}
    prefix = tmp_path_factory.mktemp("mpich")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--prefix", str(prefix), "mpich"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot install the mpich wheel from PyPI: {done.stderr.strip()[-300:]}")
    mpiexec = prefix / "bin" / "mpiexec"
    assert launcher_family(str(mpiexec)) == "mpich"
    return {"mpiexec": str(mpiexec), "env": {"MPI4PY_LIBMPI": str(prefix / "lib")}}


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return single_reference(tmp_path_factory.mktemp("single"))


def mpiexec(mpich: dict, script: list, genv: dict | None = None, timeout: float = 240):
    """Run `script` under MPICH's ``mpiexec -n 2``; it must exit 0 in time."""
    command = [mpich["mpiexec"], "-n", "2"]
    for key, value in (genv or {}).items():
        command += ["-genv", key, value]
    command += [sys.executable, *map(str, script)]
    result = run_launch(command, timeout=timeout, env={**RANK_ENV, **mpich["env"]}, cwd=str(ROOT))
    assert not result.timed_out, f"timed out after {timeout}s: {' '.join(command)}\n{result.stderr[-3000:]}"
    shown = f"{' '.join(command)}\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    assert result.returncode == 0, f"exit {result.returncode}: {shown}"
    return result


def test_every_rank_knows_itself_under_hydra(mpich, tmp_path):
    mpiexec(mpich, ["-m", "paraflow.cli", "check", "--json-dir", tmp_path])
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, report in enumerate(reports):
        p = report["process"]
        assert (p["launcher"], p["rank"], p["world_size"]) == ("mpich", rank, 2), p
        assert (p["local_rank"], p["local_world_size"]) == (rank, 2), p
        assert mpi_family(report["mpi"]["mpi4py_library"]) == "mpich", report["mpi"]


def test_ddp_gloo_under_mpiexec_matches_single(mpich, single, tmp_path):
    out = tmp_path / "ddp.pt"
    result = mpiexec(mpich, train_args("ddp-gloo", out))
    assert "held-out accuracy" in result.stdout and "launcher mpiexec (MPICH)" in result.stderr + result.stdout
    assert_same_parameters(exported_parameters(out), single)


@requires_horovod
def test_horovod_under_mpiexec_matches_single(mpich, single, float64_reference, tmp_path):
    out = tmp_path / "horovod.pt"
    if mpi_family(linked_library("horovod.torch").get("library")) == "mpich":  # its MPI controller
        result = mpiexec(mpich, train_args("horovod", out))
        assert "held-out accuracy" in result.stdout
        assert_same_parameters(exported_parameters(out), single)
    else:  # built against another MPI: the gloo controller, rank 0's address from the command line
        genv = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        mpiexec(mpich, [WORKERS / "equivalence.py", "horovod", out, 1, "option", "controller=gloo"], genv)
        trained = torch.load(out)
        for key in trained:
            torch.testing.assert_close(trained[key], float64_reference[key], rtol=1e-10, atol=1e-12, msg=key)
