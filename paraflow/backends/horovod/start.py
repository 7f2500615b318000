"""Starting horovod: the controller the launcher allows, the HOROVOD_* knobs, MPI or gloo start-up.

Horovod 0.28.1 keeps process-wide state between sessions (MPI cannot start twice; after an MPI
session it builds gloo from the closed communicator; its tuner keeps fusion and cycle-time
settings), so the guards against restarts it cannot survive live here too.

The gloo controller without horovodrun (:class:`GlooRendezvous`): ``horovodrun --gloo`` runs
horovod's ``RendezvousServer`` and hands every rank the HOROVOD_* variables that point at it.
Under other launchers (torchrun, srun, plain python, or mpirun when
the gloo controller is asked for) rank 0 starts that same server and tells the other ranks its
port through a torch ``TCPStore``:

* under torchrun, a client of the store torchrun's agent already serves at MASTER_ADDR:MASTER_PORT;
* elsewhere, a store rank 0 serves at the address the launcher gives (see ``resolve_master``).

Every rank writes its host name to the store, rank 0 turns them into horovod's host plan, and each
rank then sets the variables ``horovodrun`` would have set before ``hvd.init()``. Rank 0 keeps the
server until every rank has shut horovod down.
"""

from __future__ import annotations

import atexit
import datetime
import ipaddress
import math
import os
import socket
from collections.abc import Mapping
from typing import Optional

from ...environment.launchers import ProcessEnvironment
from ...environment.rendezvous import gloo_ifname, host_address, resolve_master
from ...errors import BackendUnavailableError, ConfigurationError, LauncherError
from ...reliability.deadlines import call_with_deadline
from ...reliability.translation import startup_errors
from ..torch_distributed import store_for_this_attempt

__all__ = [
    "launch_commands",
    "choose_controller",
    "set_knobs",
    "start_mpi",
    "start_gloo",
    "check_horovod_world",
    "note_mpi_shut_down",
    "GlooRendezvous",
    "gloo_interface",
    "ScopedEnv",
]

_mpi_finalized_by_horovod = False  # MPI cannot start twice in one process
_mpi_session_ran = False  # after one, horovod 0.28.1 builds gloo contexts from its dead MPI communicator
# Tuning knobs fixed by earlier horovod sessions in this process (None: horovod never started here).
_TUNED_KNOBS = {"HOROVOD_FUSION_THRESHOLD": "fusion_threshold_mb", "HOROVOD_CYCLE_TIME": "cycle_time_ms"}
_knobs_fixed_before: Optional[frozenset] = None


class ScopedEnv:
    """Set variables in ``os.environ`` now; :meth:`restore` puts back what was there before."""

    def __init__(self) -> None:
        self._saved: dict[str, Optional[str]] = {}

    def set(self, variables: Mapping[str, str]) -> None:
        """Set each variable, remembering its value from before the first ``set`` of it."""
        for key, value in variables.items():
            self._saved.setdefault(key, os.environ.get(key))
            os.environ[key] = value

    def restore(self) -> None:
        """Put every variable set since the last restore back as it was (unset if it was unset)."""
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved.clear()


def launch_commands(world_size: int) -> str:
    """The mpirun and horovodrun commands that start `world_size` horovod ranks, for messages."""
    n = max(world_size, 2)
    return (
        f"`mpirun -np {n} python train.py --backend horovod` (MPI controller) or "
        f"`horovodrun -np {n} -H localhost:{n} --gloo python train.py --backend horovod` "
        "(gloo controller)"
    )


def choose_controller(hvd, env: ProcessEnvironment, want: str) -> str:
    """ "mpi" or "gloo": what `want` ("auto", "mpi", "gloo") comes to under this launcher and build."""
    launcher = env.launched_by
    if launcher.runs_horovod_rendezvous:
        if want == "mpi":
            raise LauncherError(
                "controller='mpi' was asked for, but horovodrun --gloo started this process; "
                f"for the MPI controller launch with `mpirun -np {env.world_size} python "
                "train.py --backend horovod`."
            )
        return "gloo"
    if launcher.mpi or (launcher.mpi_when_asked and want == "mpi"):
        if want == "auto":
            want = "mpi" if hvd.mpi_built() else "gloo"
    elif want == "mpi":
        raise LauncherError(
            f"horovod's MPI controller needs an MPI launcher, but {env.launcher} started this "
            f"process. Launch with {launch_commands(env.world_size)}, or use controller='gloo'."
        )
    elif want == "auto":
        want = "gloo" if hvd.gloo_built() or not hvd.mpi_built() else "mpi"
    built = hvd.mpi_built() if want == "mpi" else hvd.gloo_built()
    if not built:
        raise BackendUnavailableError(
            f"horovod was built without {want.upper() if want == 'mpi' else want}, which "
            f"{env.launcher} needs here. Launch with {launch_commands(env.world_size)} as this build "
            "allows, or rebuild horovod with `paraflow build-horovod --force`."
        )
    return want


def set_knobs(
    env_vars: ScopedEnv,
    *,
    fusion_threshold_mb: Optional[float],
    cycle_time_ms: Optional[float],
    timeout: float,
    timeout_given: bool,
) -> None:
    """Set the HOROVOD_* variables ``hvd.init()`` reads, in `env_vars` (restored at shutdown).

    An explicit timeout (`timeout_given`) wins over HOROVOD_* timeouts set in the shell.
    """
    knobs: dict[str, str] = {}
    if fusion_threshold_mb is not None:
        knobs["HOROVOD_FUSION_THRESHOLD"] = str(int(fusion_threshold_mb * 1024 * 1024))
    if cycle_time_ms is not None:
        knobs["HOROVOD_CYCLE_TIME"] = repr(float(cycle_time_ms))
    seconds = max(1, math.ceil(timeout))
    timeouts = {
        "HOROVOD_GLOO_TIMEOUT_SECONDS": str(seconds),
        "HOROVOD_STALL_CHECK_TIME_SECONDS": str(min(60, seconds)),
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": str(seconds),
    }
    for key, value in timeouts.items():
        if timeout_given or key not in os.environ:
            knobs[key] = value
    env_vars.set(knobs)
    _check_restart_knobs()


def _check_restart_knobs() -> None:
    """Refuse a restart that horovod 0.28.1's tuner would crash on or silently get wrong.

    Its parameter manager outlives ``hvd.shutdown()``: a fusion threshold or cycle time fixed in
    one session stays fixed in the next, and once both have been fixed ``hvd.init()`` segfaults.
    """
    global _knobs_fixed_before
    now = frozenset(k for k in _TUNED_KNOBS if k in os.environ)
    before, _knobs_fixed_before = _knobs_fixed_before, (_knobs_fixed_before or frozenset()) | now
    if not before or (before == now and len(now) == 1):
        return
    _knobs_fixed_before = before
    names = " and ".join(sorted(_TUNED_KNOBS[k] for k in before | now))
    raise ConfigurationError(
        f"horovod cannot restart in this process with these tuning options: it keeps {names} "
        "(HOROVOD_FUSION_THRESHOLD / HOROVOD_CYCLE_TIME) from one session to the next and "
        "crashes once both have been set. Start each horovod session with these options in a "
        "new process, or keep the same single option in every session."
    )


def start_mpi(hvd, env_vars: ScopedEnv) -> bool:
    """Start horovod's MPI controller; True when mpi4py owns MPI (so horovod may start again)."""
    global _mpi_session_ran
    if _mpi_finalized_by_horovod:
        raise ConfigurationError(
            "horovod already shut MPI down in this process, and MPI cannot start twice. "
            "Install mpi4py (`pip install mpi4py`) so MPI stays up between horovod sessions, "
            "or start horovod once per process."
        )
    try:  # mpi4py owns MPI_Init/Finalize when present, so horovod can start again later
        from mpi4py import MPI

        if not MPI.Is_initialized():
            MPI.Init_thread(MPI.THREAD_MULTIPLE)
            atexit.register(lambda: MPI.Is_finalized() or MPI.Finalize())
        uses_mpi4py = True
    except ImportError:
        uses_mpi4py = False
    env_vars.set({"HOROVOD_CONTROLLER": "mpi"})
    _mpi_session_ran = True
    hvd.init()
    return uses_mpi4py


def note_mpi_shut_down() -> None:
    """Record that horovod finalized MPI itself: it cannot start again in this process."""
    global _mpi_finalized_by_horovod
    _mpi_finalized_by_horovod = True


def start_gloo(hvd, env: ProcessEnvironment, timeout: float):
    """Start horovod's gloo controller; returns the rendezvous paraflow started, or None.

    Under horovodrun its rendezvous server is already there; under any other launcher rank 0
    starts horovod's own (:class:`GlooRendezvous`).
    """
    if _mpi_session_ran:
        raise ConfigurationError(
            "horovod ran with its MPI controller earlier in this process and cannot switch to "
            "gloo afterwards (it would build gloo from MPI's closed communicator and abort). "
            "Use the MPI controller again (controller='mpi'), or a new process."
        )
    rendezvous = None
    try:
        if not env.launched_by.runs_horovod_rendezvous:
            addr, port = resolve_master(env)
            # torchrun's agent serves a store there; without it (rare) rank 0 serves one.
            serve = not env.launched_by.serves_store or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
            rendezvous = GlooRendezvous(env, addr, port, serve_store=serve, timeout=timeout)
            with startup_errors(
                rank=env.rank,
                world_size=env.world_size,
                address=addr,
                port=port,
                timeout=timeout,
                launcher=env.launcher,
            ):
                call_with_deadline(rendezvous.start, timeout + 10, "the horovod rendezvous")
        elif not os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"):
            raise LauncherError(
                "HOROVOD_RANK is set but HOROVOD_GLOO_RENDEZVOUS_ADDR is not: start the job with "
                f"`horovodrun -np {env.world_size} -H localhost:{env.world_size} --gloo python "
                "train.py --backend horovod`."
            )
        hvd.init()
    except BaseException:
        if rendezvous is not None:
            rendezvous.close()
        raise
    return rendezvous


def check_horovod_world(hvd, env: ProcessEnvironment) -> None:
    """Raise LauncherError when horovod's rank and size disagree with the launcher's."""
    if (hvd.size(), hvd.rank()) != (env.world_size, env.rank):
        raise LauncherError(
            f"{env.launcher} says this is rank {env.rank} of {env.world_size}, but horovod "
            f"started as rank {hvd.rank()} of {hvd.size()}: its MPI library does not belong to "
            f"this launcher (horovod here was built against another MPI; `paraflow check` names the "
            f"MPI horovod and mpi4py load). Launch with {launch_commands(env.world_size)} from that "
            "MPI, or rebuild horovod against this one: `paraflow build-horovod --force` with its mpicc first on PATH."
        )


def gloo_interface(peer: str) -> str:
    """The network interface this host uses to reach `peer` (an address or host name)."""
    import psutil  # a horovod dependency

    try:
        local_ip = _local_ip_towards(peer)
    except OSError:
        return "lo"
    if ipaddress.ip_address(local_ip).is_loopback:
        return "lo"
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == local_ip for a in addresses):
            return name
    return "lo"


def _local_ip_towards(peer: str) -> str:
    """The source address the kernel picks for packets to `peer` (UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(peer), 9))
        return s.getsockname()[0]


class GlooRendezvous:
    """Rank 0's horovod rendezvous server, found by the other ranks through a torch TCPStore.

    Args:
        env: this process's place in the job.
        store_addr: host of the TCPStore the ranks meet at.
        store_port: its port.
        serve_store: rank 0 serves the store (False: a launcher such as torchrun already does).
        timeout: seconds to wait for the other ranks.
    """

    def __init__(
        self, env: ProcessEnvironment, store_addr: str, store_port: int, *, serve_store: bool, timeout: float
    ) -> None:
        self.env = env
        self.store_addr = store_addr
        self.store_port = store_port
        self.serve_store = serve_store
        self.timeout = timeout
        self.variables: dict[str, str] = {}
        self._store = None
        self._server = None
        self._env_vars = ScopedEnv()

    @property
    def single_host(self) -> bool:
        """True when every rank runs on this host."""
        return self.env.local_world_size == self.env.world_size

    def start(self) -> dict[str, str]:
        """Meet the other ranks, start the server on rank 0, and set this rank's HOROVOD_* variables.

        Returns:
            The variables set in ``os.environ`` (restored by :meth:`close`).
        """
        from horovod.runner.common.util.hosts import HostInfo, get_host_assignments

        env = self.env
        serve = self.serve_store and env.rank == 0
        store = self._store = store_for_this_attempt(
            self.store_addr, self.store_port, env.world_size, self.timeout, serve=serve
        )
        hostname = socket.gethostname()
        store.set(f"host/{env.rank}", hostname)
        hosts = self._gather_hosts(store)
        # horovodrun's own plan: every process's local and cross rank from the hosts, in rank order
        plan = get_host_assignments([HostInfo(h, hosts.count(h)) for h in dict.fromkeys(hosts)], env.world_size)
        if env.rank == 0:
            from horovod.runner.http.http_server import RendezvousServer

            self._server = RendezvousServer()
            port = self._server.start()
            self._server.init(plan)
            addr = "127.0.0.1" if self.single_host else host_address(socket.getfqdn)
            store.set("server", f"{addr}:{port}")
        else:
            store.wait(["server"])
        addr, _, port = store.get("server").decode().rpartition(":")
        # A launcher that gives no local rank (torch's env://): this rank's place among those on its host.
        local_rank = env.local_rank if env.local_known else hosts[: env.rank].count(hostname)
        slot = next(s for s in plan if s.hostname == hostname and s.local_rank == local_rank)
        self.variables = {
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": addr,
            "HOROVOD_GLOO_RENDEZVOUS_PORT": port,
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": os.environ.get("HOROVOD_CPU_OPERATIONS", "gloo"),
            "HOROVOD_GLOO_IFACE": os.environ.get("HOROVOD_GLOO_IFACE")
            or ("lo" if self.single_host else gloo_ifname() or gloo_interface(addr)),
            "HOROVOD_HOSTNAME": hostname,
            "HOROVOD_RANK": str(env.rank),
            "HOROVOD_SIZE": str(env.world_size),
            "HOROVOD_LOCAL_RANK": str(slot.local_rank),
            "HOROVOD_LOCAL_SIZE": str(slot.local_size),
            "HOROVOD_CROSS_RANK": str(slot.cross_rank),
            "HOROVOD_CROSS_SIZE": str(slot.cross_size),
        }
        self._env_vars.set(self.variables)
        return self.variables

    def close(self) -> None:
        """After ``hvd.shutdown()``: rank 0 waits for every rank to finish, then stops the server."""
        store, self._store = self._store, None
        try:
            if store is not None:
                if self.env.rank == 0:
                    keys = [f"done/{r}" for r in range(1, self.env.world_size)]
                    if keys:
                        try:
                            store.wait(keys, datetime.timedelta(seconds=min(self.timeout, 60)))
                        except Exception:  # a rank that died; nothing left to keep alive for it
                            pass
                else:
                    store.set(f"done/{self.env.rank}", "1")
        finally:
            if self._server is not None:
                self._server.stop()
                self._server = None
            self._env_vars.restore()

    # ---------------------------------------------------------------- helpers
    def _gather_hosts(self, store) -> list[str]:
        keys = [f"host/{r}" for r in range(self.env.world_size)]
        store.wait(keys)
        return [store.get(k).decode() for k in keys]
