"""A real Slurm on the emulated cluster: munged, slurmctld on node0, one slurmd per host.

Debian's ``slurmd slurmctld slurm-client munge`` (slurm-wlm 22.05) are installed with apt-get
when missing; a test that cannot have them, or a machine without network namespaces, is skipped
with the reason. Everything Slurm needs lives in one scratch directory: ``slurm.conf`` and
``cgroup.conf`` (every command finds them through ``SLURM_CONF``), the munge key and socket, state,
spool, pid and log files. node0 is the head and login node: slurmctld runs there and so do
``srun`` and ``sbatch``, so every address in play is one of the cluster's (198.18.0.0/24).
:meth:`SlurmCluster.stop` ends every daemon and checks none is left; the scratch directory goes.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

import pytest
from clusterkit import build, job_env, skip_without_namespaces
from conftest import ROOT
from reliability.leftovers import _alive
from reliability.leftovers import _command as command_line

from paraflow.tools.cluster import Cluster, exec_argv

__all__ = ["SlurmCluster", "ensure_slurm", "slurm_fixture", "command_line"]

#: What the cluster tests need from Debian.
PACKAGES = ("slurmd", "slurmctld", "slurm-client", "munge")
#: The programs those packages bring.
PROGRAMS = ("slurmctld", "slurmd", "srun", "sbatch", "sinfo", "scontrol", "munged")
SLURMCTLD_PORT, SLURMD_PORT = 6817, 6818  # each host is a fresh network namespace: nothing else listens
PARTITION = "pf"
#: Seconds for the daemons to come up and the nodes to turn idle.
START_S = 90


def _missing() -> list:
    return [p for p in PROGRAMS if shutil.which(p) is None]


def ensure_slurm() -> None:
    """Install Debian's Slurm and munge when a program is missing; skip the caller if that fails."""
    if not _missing():
        return
    if os.geteuid() != 0:
        pytest.skip(f"Slurm is not installed ({', '.join(_missing())} missing) and installing it needs root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", *PACKAGES]
    done = subprocess.run(install, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, env=env, timeout=600)
        done = subprocess.run(install, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0 or _missing():
        pytest.skip(
            f"cannot install Debian's Slurm (`{' '.join(install)}` exit {done.returncode}): "
            f"{(done.stderr or done.stdout).strip()[-300:]}"
        )


def _slurm_conf(cluster: Cluster, scratch: Path) -> str:
    nodes = "".join(
        f"NodeName={h.name} NodeAddr={h.address} CPUs=2 Sockets=1 CoresPerSocket=2 ThreadsPerCore=1 State=UNKNOWN\n"
        for h in cluster.hosts
    )
    head = cluster.hosts[0]
    return f"""# Written by the paraflow cluster tests; removed with its directory.
ClusterName=pf{cluster.name}
SlurmctldHost={head.name}({head.address})
SlurmctldPort={SLURMCTLD_PORT}
SlurmdPort={SLURMD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={scratch}/munge/munge.socket
StateSaveLocation={scratch}/state
SlurmdSpoolDir={scratch}/spool/%n
SlurmctldPidFile={scratch}/run/slurmctld.pid
SlurmdPidFile={scratch}/run/slurmd-%n.pid
SlurmctldLogFile={scratch}/log/slurmctld.log
SlurmdLogFile={scratch}/log/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MessageTimeout=10
KillWait=5
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
{nodes}PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
"""


class SlurmCluster:
    """Slurm's daemons on an emulated cluster, and commands run on its login node (node0)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.scratch = Path(tempfile.mkdtemp(prefix="pf-slurm-"))
        self.conf = self.scratch / "slurm.conf"
        self.daemons: dict[str, subprocess.Popen] = {}
        self._logs: list = []
        self._stopped = False

    @property
    def env(self) -> dict:
        """What every Slurm command and job here runs with: this slurm.conf, one thread, this checkout."""
        return job_env(SLURM_CONF=str(self.conf))

    # ---------------------------------------------------------------- life cycle
    def start(self) -> SlurmCluster:
        try:
            self._write_files()
            self._start_munged()
            head = self.cluster.hosts[0].name
            self._daemon("slurmctld", exec_argv(self.cluster, head, ["slurmctld", "-D", "-f", self.conf]))
            for host in self.cluster.hosts:
                argv = ["slurmd", "-D", "-N", host.name, "-f", self.conf]
                self._daemon(f"slurmd-{host.name}", exec_argv(self.cluster, host.name, argv))
            self._wait_idle()
        except BaseException:
            self.stop(check=False)
            raise
        return self

    def _write_files(self) -> None:
        os.chmod(self.scratch, 0o755)  # munged runs as user munge and must reach its directory
        for sub in ("state", "spool", "run", "log"):
            (self.scratch / sub).mkdir()
        for host in self.cluster.hosts:
            (self.scratch / "spool" / host.name).mkdir()
        self.conf.write_text(_slurm_conf(self.cluster, self.scratch))
        # This slurmd cannot start without a cgroup plugin it can load; proctrack/linuxproc tracks tasks.
        (self.scratch / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        munge = pwd.getpwnam("munge")
        folder = self.scratch / "munge"
        folder.mkdir()
        folder.chmod(0o755)  # munged: the socket's directory must be reachable by every user
        key = folder / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for path in (folder, key):
            os.chown(path, munge.pw_uid, munge.pw_gid)

    def _start_munged(self) -> None:
        folder = self.scratch / "munge"
        argv = [
            "munged",
            "--foreground",
            f"--socket={folder}/munge.socket",
            f"--key-file={folder}/munge.key",
            f"--pid-file={folder}/munged.pid",
            f"--log-file={folder}/munged.log",
            f"--seed-file={folder}/munged.seed",
        ]
        munge = pwd.getpwnam("munge")
        self._daemon("munged", argv, user=munge.pw_uid, group=munge.pw_gid)
        deadline = time.monotonic() + 20
        while not (folder / "munge.socket").exists():
            self._check_daemons()
            if time.monotonic() > deadline:
                raise RuntimeError(f"munged did not create its socket within 20 s\n{self.logs()}")
            time.sleep(0.1)

    def _daemon(self, name: str, argv: list, **options) -> None:
        log = open(self.scratch / "log" / f"{name}.out", "w")
        self._logs.append(log)
        self.daemons[name] = subprocess.Popen(
            [str(a) for a in argv],
            env={**os.environ, **self.env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **options,
        )

    def _check_daemons(self) -> None:
        for name, proc in self.daemons.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode} while starting\n{self.logs()}")

    def _wait_idle(self) -> None:
        deadline = time.monotonic() + START_S
        states = ""
        while time.monotonic() < deadline:
            self._check_daemons()
            done = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=20, check=False)
            states = done.stdout.strip()
            lines = [line.split() for line in states.splitlines()]
            if len(lines) == len(self.cluster.hosts) and all(state == "idle" for _, state in lines):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the Slurm nodes were not idle within {START_S} s: {states!r}\n{self.logs()}")

    def stop(self, check: bool = True) -> list:
        """End every daemon (SIGTERM, then SIGKILL after 15 s) and remove the scratch directory.

        Returns:
            The daemons that had to be killed or were still there afterwards (with `check`: none).
        """
        if self._stopped:
            return []
        self._stopped = True
        stubborn = []
        for proc in reversed(list(self.daemons.values())):
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        for name, proc in self.daemons.items():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                stubborn.append(name)
                proc.kill()
                proc.wait(timeout=10)
        for log in self._logs:
            log.close()
        still = [name for name, proc in self.daemons.items() if _alive(proc.pid)]
        shutil.rmtree(self.scratch, ignore_errors=True)
        if check:
            assert not still, f"Slurm daemons still running after stop: {still}"
        return stubborn + still

    # ---------------------------------------------------------------- use
    def run(
        self, argv: list, timeout: float, check: bool = True, host: Optional[str] = None, env: Optional[dict] = None
    ):
        """Run `argv` on `host` (default the login node, node0) with this Slurm's configuration."""
        full = exec_argv(self.cluster, host or self.cluster.hosts[0].name, [str(a) for a in argv])
        done = subprocess.run(
            full,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=str(ROOT),
            env={**os.environ, **self.env, **(env or {})},
        )
        if check:
            assert done.returncode == 0, (
                f"exit {done.returncode}: {' '.join(map(str, argv))}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
            )
        return done

    def start_on_login(self, argv: list, env: Optional[dict] = None, **streams) -> subprocess.Popen:
        """Start `argv` on node0 without waiting (in a process group of its own)."""
        full = exec_argv(self.cluster, self.cluster.hosts[0].name, [str(a) for a in argv])
        return subprocess.Popen(
            full,
            text=True,
            cwd=str(ROOT),
            env={**os.environ, **self.env, **(env or {})},
            start_new_session=True,
            **streams,
        )

    def logs(self) -> str:
        """The tail of every daemon's log (for failure messages)."""
        parts = []
        for path in sorted((self.scratch / "log").glob("*")) + [self.scratch / "munge" / "munged.log"]:
            try:
                parts.append(f"--- {path.name}\n{path.read_text()[-1500:]}")
            except OSError:
                pass
        return "\n".join(parts)

    def jobs(self) -> str:
        """Jobs Slurm still knows as pending or running (``squeue``), one per line."""
        return self.run(["squeue", "-h", "-o", "%i %T %j"], timeout=20, check=False).stdout.strip()


@pytest.fixture(scope="module", name="slurm")
def slurm_fixture():
    """Two emulated hosts running Slurm for one test module; afterwards no daemon, process or
    namespace of it is left."""
    skip_without_namespaces()
    ensure_slurm()
    cluster = build("slurm")
    slurm = None
    try:
        slurm = SlurmCluster(cluster).start()
        yield slurm
        stubborn = slurm.stop(check=False)
        left = cluster.processes()
    finally:
        if slurm is not None:
            slurm.stop(check=False)
        cluster.down()
    assert not stubborn, f"Slurm daemons did not stop on SIGTERM within 15 s: {stubborn}"
    assert not left, f"processes were still running in the cluster's namespaces: {left}"
    assert not cluster.exists()
