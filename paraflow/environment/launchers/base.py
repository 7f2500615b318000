"""The Launcher interface: what paraflow knows about one way of starting processes.

A launcher is detected from the environment it gives the processes it starts; it says which
process this is (rank, world size, local rank and size), where rank 0 is, which job this is on a
host, what must happen for a rank's error to end the job and, for those paraflow starts itself,
the command that starts a script. Every launcher is one module of this package, registered in a
fixed priority (:mod:`paraflow.environment.launchers`); code elsewhere asks the object, never the name.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Optional

from ...errors import ConfigurationError, LauncherError

__all__ = ["Launcher", "ProcessEnvironment", "Identity", "HostCommand", "free_port"]


def free_port(host: str = "") -> int:
    """A TCP port free on this host right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class HostCommand:
    """What to run on one host: the command and the variables to set there first."""

    host: str
    argv: list
    env: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Identity:
    """This process's place in the job as a launcher gives it; `note` says what was assumed."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    note: str = ""
    #: False when the local rank and size are assumed, not given (torch's env:// without LOCAL_RANK).
    local_known: bool = True


@dataclass(frozen=True)
class ProcessEnvironment:
    """This process's place in the job, as the launcher described it."""

    launcher: str
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    #: What the launcher's variables left open and was assumed (for the banner), else "".
    note: str = ""
    #: False when local_rank and local_world_size are assumed, not given by the launcher.
    local_known: bool = True

    @property
    def launched_by(self) -> Launcher:
        """The registered :class:`Launcher` named `launcher`."""
        from . import get_launcher

        return get_launcher(self.launcher)

    @property
    def is_distributed(self) -> bool:
        """True when the launcher started more than one process."""
        return self.world_size > 1

    @property
    def is_mpi(self) -> bool:
        """True when an MPI launcher (mpirun, mpiexec) started this process."""
        return self.launched_by.mpi


class Launcher:
    """One launcher. Subclasses set the class attributes and override what differs.

    The default reading: the launcher started this process when its rank variable is set, and
    its four variables give the identity (a missing one is a half-set environment).
    """

    #: The name ProcessEnvironment.launcher, records and messages use.
    name: str = ""
    #: How a user starts a job with it (for messages).
    command: str = ""
    #: How the banner names it, when not the name.
    label: str = ""
    #: Its variables: rank, world size, local rank, local world size (None: it sets none).
    rank_variable: Optional[str] = None
    world_size_variable: Optional[str] = None
    local_rank_variable: Optional[str] = None
    local_world_size_variable: Optional[str] = None
    #: Other variables, and whole families by prefix, that it sets for its processes.
    other_variables: tuple = ()
    variable_prefixes: tuple = ()
    #: Variables whose presence without the rank variable means a half-set environment.
    stray_variables: tuple = ()
    #: Variables whose values name one job on one host, first complete set wins (last words' records).
    job_variables: tuple = ()
    #: An MPI implementation: its ranks share MPI_COMM_WORLD (horovod's MPI controller, rank 0's
    #: address shared over MPI, MPI_Abort to end the job).
    mpi: bool = False
    #: Which MPI's launcher it is ("openmpi", "mpich"), for MPI settings of that family.
    mpi_family: Optional[str] = None
    #: Whether its ranks may run horovod's MPI controller when asked, though it is no MPI launcher.
    mpi_when_asked: bool = False
    #: It ends the whole job as soon as one rank exits with an error; if not, paraflow must.
    ends_job_on_a_failed_rank: bool = True
    #: MASTER_ADDR and MASTER_PORT are part of its contract: a missing one is named as such.
    sets_master: bool = False
    #: It serves torch's TCPStore at MASTER_PORT itself (torchrun's agent).
    serves_store: bool = False
    #: It runs horovod's own gloo rendezvous (horovodrun).
    runs_horovod_rendezvous: bool = False
    #: Not a launcher: no variables, one process (or ranks started by hand).
    is_plain: bool = False
    #: The program paraflow starts jobs with (None: paraflow never starts it).
    tool: Optional[str] = None
    #: paraflow can start it on several hosts.
    multihost: bool = False
    #: Its program is there wherever torch is (no install to check for).
    comes_with_torch: bool = False
    #: Across hosts it runs one agent per host, each started with a command of its own.
    agent_per_host: bool = False
    #: How a job it launched elastically survives a lost worker: "rollback" (the survivors restore
    #: the last commit in process and go on at the new size), "restart" (every worker is started
    #: again and restores the last checkpoint), or None (it cannot: a lost worker ends the job).
    recovery: Optional[str] = None
    #: How a user launches it elastically (for messages), when it can be.
    elastic_command: str = ""

    # ---------------------------------------------------------------- reading the environment
    def detect(self, env: Mapping[str, str]) -> bool:
        """Whether this launcher started the process whose environment is `env`."""
        return self.rank_variable is not None and self.rank_variable in env

    def identity(self, env: Mapping[str, str]) -> Identity:
        """Rank, world size, local rank and local world size from `env` (detected)."""
        rank = self.integer(env, self.rank_variable)
        world = self.integer(env, self.world_size_variable)
        local_rank = self.integer(env, self.local_rank_variable) if self.local_rank_variable else 0
        if self.local_world_size_variable and self.local_world_size_variable in env:
            local_world = self.integer(env, self.local_world_size_variable)
        else:
            local_world = world
        return Identity(rank, world, local_rank, local_world)

    def master(self, env: Mapping[str, str]) -> tuple[Optional[str], Optional[int]]:
        """Rank 0's address and port where the launcher gives them (MASTER_ADDR, MASTER_PORT)."""
        addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
        return addr or None, self._port(port)

    def job_key(self, env: Mapping[str, str]) -> Optional[str]:
        """A string that names this job on this host (every local rank finds the same), or None."""
        if self.job_variables and all(env.get(n) for n in self.job_variables):
            return "-".join(env[n] for n in self.job_variables)
        return None

    def variables(self) -> tuple:
        """The names of every variable it sets that a launcher started inside its job must not see."""
        own = (self.rank_variable, self.world_size_variable, self.local_rank_variable, self.local_world_size_variable)
        return tuple(n for n in own if n) + self.other_variables

    def environment(self, env: Mapping[str, str]) -> ProcessEnvironment:
        """The ProcessEnvironment of a process it started; LauncherError when the values disagree."""
        who = self.identity(env)
        if (
            who.world_size < 1
            or not 0 <= who.rank < who.world_size
            or not 0 <= who.local_rank < max(who.local_world_size, 1)
        ):
            raise LauncherError(
                f"inconsistent {self.name} environment: rank {who.rank}, world size {who.world_size}, "
                f"local rank {who.local_rank}, local size {who.local_world_size}. Relaunch with `{self.command}`."
            )
        addr, port = self.master(env)
        return ProcessEnvironment(
            self.name,
            who.rank,
            who.world_size,
            who.local_rank,
            who.local_world_size,
            addr,
            port,
            who.note,
            who.local_known,
        )

    def launched_elastic(self, env: Mapping[str, str]) -> bool:
        """Whether the job of `env` was launched to survive a lost worker (see `recovery`)."""
        return False

    def inside_an_allocation(self, env: Mapping[str, str]) -> bool:
        """Whether `env` is inside a job allocation of this launcher's scheduler, where ``paraflow
        run`` starts jobs with it by default."""
        return False

    # ---------------------------------------------------------------- starting a job (tool only)
    def launch_command(
        self,
        python: str,
        nproc: int,
        script: Sequence[str],
        *,
        port: Optional[int],
        env_keys: Sequence[str],
        hosts: Optional[Sequence[tuple[str, int]]],
        node_rank: int,
        must_exist: bool,
    ) -> list[str]:
        """The command that starts `script` as `nproc` processes (see tools.launch.launch_command)."""
        raise ConfigurationError(f"paraflow does not start jobs with {self.name}; launch it with `{self.command}`.")

    def elastic_launch_command(
        self,
        python: str,
        nproc: int,
        min_np: int,
        max_np: int,
        script: Sequence[str],
        *,
        port: Optional[int],
        discovery: str,
        max_restarts: int,
        must_exist: bool,
    ) -> list[str]:
        """The command that starts `script` on this host as `nproc` processes that survive a lost
        worker (between `min_np` and `max_np` of them where the launcher can change the number);
        `discovery` is the path of the host-discovery script written for it (see `discovery_script`)."""
        raise ConfigurationError(
            f"{self.label or self.name} cannot replace a lost worker; leave --launcher out and "
            "`paraflow run --elastic` picks the backend's elastic launcher."
        )

    def discovery_script(self, max_np: int) -> Optional[str]:
        """The host-discovery script an elastic job on this host needs (None: it needs none)."""
        return None

    def host_commands(
        self,
        python: str,
        hosts: Sequence[str],
        nproc_per_host: int,
        script: Sequence[str],
        *,
        port: int,
        ifname: Optional[str],
        env_keys: Sequence[str],
        rsh_agent: Optional[str],
        job_id: Optional[str],
    ) -> list[HostCommand]:
        """The per-host commands of a job across `hosts` (see tools.launch.host_commands); multihost only."""
        raise ConfigurationError(f"paraflow does not start {self.name} across hosts.")

    def command_on_the_first_host(
        self,
        python: str,
        hosts: Sequence[str],
        nproc_per_host: int,
        script: Sequence[str],
        env_keys: Sequence[str],
        extra: Sequence[str],
        env: dict,
    ) -> HostCommand:
        """This launcher's command for every host's processes, run on the first host, with `extra`
        before the Python command and `env` set there (and forwarded to the ranks)."""
        placement = [(host, nproc_per_host) for host in hosts]
        argv = self.launch_command(
            python,
            len(hosts) * nproc_per_host,
            script,
            port=None,
            env_keys=[*env, *env_keys],
            hosts=placement,
            node_rank=0,
            must_exist=True,
        )
        at = argv.index(python)
        return HostCommand(hosts[0], [*argv[:at], *extra, *argv[at:]], env)

    # ---------------------------------------------------------------- helpers
    def integer(self, env: Mapping[str, str], key: Optional[str]) -> int:
        """`env[key]` as an integer; LauncherError naming the half-set launcher when it is missing."""
        value = env.get(key) if key else None
        if value is None or value == "":
            raise LauncherError(
                f"{self.name} environment is half-set: {self.rank_variable} is present but {key} is "
                f"missing. Start the job with its launcher (`{self.command}`) instead of setting "
                f"variables by hand, or set every one of them."
            )
        try:
            return int(value)
        except ValueError:
            raise LauncherError(f"{key}={value!r} is not an integer (set by {self.name}?).") from None

    @staticmethod
    def _port(value: Optional[str]) -> Optional[int]:
        return int(value) if value else None

    def __repr__(self) -> str:
        return f"<Launcher {self.name}>"
