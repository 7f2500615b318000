"""`make install` as a new user would run it: created without sudo, a fresh clone, a clean environment.

The environment holds HOME, PATH (the system directories only) and PARAFLOW_* alone, no PIP_*
variables; pip's system-wide configuration files still apply, as they would for that user. The
user's horovod wheel cache is seeded from this one's and what it builds is kept here: the cache
key names the torch, Python, MPI and the mpicc's path, so a seeded wheel is only ever one built for
exactly that combination.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT

from paraflow.backends.horovod.build import wheel_cache

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
USER = "pfinstall"
#: docs/hpc.md's check of the MPI mpi4py uses
MPI4PY_LIBRARY = "from mpi4py import MPI; print(MPI.Get_library_version())"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("useradd"), reason="creating a user to install as needs root and useradd"
)


def _cpu_torch_wheel() -> str | None:
    """A CPU torch wheel in the find-links directories of this machine's pip configuration, if any."""
    done = subprocess.run(["python3", "-m", "pip", "config", "list"], capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if "find-links" in line:
            for folder in line.split("=", 1)[1].strip("'\" ").split():
                found = sorted(Path(folder).glob("torch-2.13.0+cpu-*.whl"))
                if found:
                    return str(found[-1])
    return None


@pytest.fixture
def user(tmp_path):
    """A user made for this test, without sudo, removed with its home afterwards."""
    subprocess.run(["userdel", "-r", USER], capture_output=True)  # one a killed run left behind
    subprocess.run(["useradd", "-m", "-s", "/bin/bash", USER], check=True)
    try:
        yield pwd.getpwnam(USER)
    finally:
        subprocess.run(["userdel", "-r", USER], capture_output=True)


def _as_user(account, command: list[str], cwd: Path, env: dict[str, str], timeout: float):
    clean = ["env", "-i", f"HOME={account.pw_dir}", f"PATH={SYSTEM_PATH}", *(f"{k}={v}" for k, v in env.items())]
    return subprocess.run(
        clean + command,
        cwd=cwd,
        user=account.pw_uid,
        group=account.pw_gid,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _copy_wheels(source: Path, target: Path, owner=None) -> None:
    for folder in source.glob("horovod-*") if source.is_dir() else []:
        if any(folder.glob("*.whl")) and not (target / folder.name).exists():
            shutil.copytree(folder, target / folder.name)
            if owner is not None:
                for path in [target / folder.name, *(target / folder.name).iterdir()]:
                    os.chown(path, owner.pw_uid, owner.pw_gid)


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("mpi", ["pypi", "system"])
def test_make_install_as_a_new_user_in_a_clean_environment(user, mpi):
    if mpi == "system" and not shutil.which("mpicc", path=SYSTEM_PATH):
        pytest.skip("no system MPI (mpicc) on the system PATH")
    home = Path(user.pw_dir)
    clone = home / "paraflow"
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    subprocess.run(["git", "checkout", "-q", head.strip()], cwd=clone, check=True)
    subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", str(home)], check=True)
    cache = home / ".cache" / "paraflow" / "wheels"
    for folder in (cache, cache.parent, cache.parent.parent):
        folder.mkdir(parents=True, exist_ok=True)
        os.chown(folder, user.pw_uid, user.pw_gid)
    _copy_wheels(wheel_cache(), cache, user)

    env = {"PARAFLOW_MPI": mpi}
    wheel = _cpu_torch_wheel() if mpi == "system" else None
    if wheel:  # the system-MPI case also shows PARAFLOW_TORCH_SPEC taking a wheel file
        env["PARAFLOW_TORCH_SPEC"] = wheel
    started = time.monotonic()
    done = _as_user(user, ["make", "install"], clone, env, timeout=3300)
    took = time.monotonic() - started
    said = done.stdout + done.stderr
    assert done.returncode == 0, f"make install as {USER} exited {done.returncode}:\n{said[-6000:]}"
    print(f"make install as {USER} (PARAFLOW_MPI={mpi}): {took:.0f}s")
    _copy_wheels(cache, wheel_cache())

    print("\n".join(line for line in said.splitlines() if line.startswith(("MPI:", "torch ", "horovod ", "mpi4py"))))
    torch_line = next(line for line in said.splitlines() if line.startswith("torch "))
    if wheel:
        assert "+cpu (CPU build): PARAFLOW_TORCH_SPEC=" in torch_line
    assert "horovod without GPU operations" in said or "horovod with GPU operations" in said

    report = json.loads(_as_user(user, [".venv/bin/paraflow", "check", "--json"], clone, {}, 300).stdout)
    family = "MPICH" if mpi == "pypi" else "Open MPI"
    assert family in report["mpi"]["mpi4py_library"], report["mpi"]
    assert report["mpi"]["mismatch"] is None, report["mpi"]
    assert report["torch"]["build"] in torch_line
    mpirun = str(clone / ".venv/bin/mpirun") if mpi == "pypi" else shutil.which("mpirun", path=SYSTEM_PATH)
    assert report["mpi"]["mpirun"] == mpirun
    asked = _as_user(user, [".venv/bin/python", "-c", MPI4PY_LIBRARY], clone, {}, 120)
    assert asked.stdout.startswith("MPICH Version:" if mpi == "pypi" else "Open MPI"), asked.stdout + asked.stderr

    for backend in ("horovod", "ddp-gloo"):
        run = [mpirun, "-np", "2", ".venv/bin/python", "train.py", "--backend", backend, "--data", "digits"]
        trained = _as_user(user, [*run, "--epochs", "2"], clone, {"OMP_NUM_THREADS": "1"}, timeout=600)
        out = trained.stdout + trained.stderr
        assert trained.returncode == 0 and "held-out accuracy" in out, f"{backend} under {mpirun}:\n{out[-4000:]}"
