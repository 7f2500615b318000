"""``paraflow run``: start a script under the launcher its backend wants; end every process it started.

The backend class says which launchers it is started with (``LAUNCHERS``, preferred first);
inside a SLURM allocation multi-process backends go through ``srun``. The command lines
themselves come from :func:`paraflow.tools.launch.launch_command`, the one place that knows
each launcher's syntax. The command is printed before it runs (``--dry-run`` prints only), the
job's exit status becomes this command's, and Ctrl-C, SIGTERM, SIGHUP or ``--job-timeout`` kill
the launcher and every process below it: the launch runs in a session of its own, and this
process adopts (Linux subreaper) and kills whatever a launcher leaves behind.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Optional

from ..core.placement import cores
from ..environment.launchers import launcher_for_tool, launcher_tools, launcher_variables, registered_launchers
from ..environment.launchers.openmpi import MPI_YIELD
from ..errors import BackendUnavailableError, ConfigurationError, ParaflowError
from ..reliability.last_words import JOB_DIR_ENV, job_ended, new_job_directory
from .flags import renamed
from .horovod_api import environment as horovod_api_environment
from .launch import find_tool, kill_descendants, launch_command, prctl, run_launch

__all__ = ["add_arguments", "run_from_args", "plan_run", "RunPlan"]

RUN_LAUNCHERS = ("auto", *launcher_tools())
#: How the job's processes learn the backend: ``paraflow.init()`` with no name reads it.
BACKEND_VARIABLE = "PARAFLOW_BACKEND"
# A new job's own identity; the allocation's other SLURM_* variables stay, srun and mpirun need them.
_SLURM_TASK = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID")


@dataclass
class RunPlan:
    """The command per host (one for this host unless torchrun spans several) and the job's environment."""

    commands: list  # (host or None, argv)
    env: dict = field(default_factory=dict)  # added (value) or removed (None) for the job
    files: dict = field(default_factory=dict)  # path -> text, written (executable) before the job starts

    def shown(self, argv: Sequence[str]) -> str:
        """`argv` as a shell line, preceded by the variables the job sets."""
        settings = [f"{k}={shlex.quote(v)}" for k, v in self.env.items() if v is not None]
        return " ".join([*settings, shlex.join(argv)])


def parse_hosts(text: str) -> list[tuple[str, int]]:
    """``"h1:2,h2:2"`` -> ``[("h1", 2), ("h2", 2)]``; a host without a count holds one process."""
    hosts = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = re.fullmatch(r"([^\s:,]+)(?::(\d+))?", item)
        if not match or (match.group(2) is not None and int(match.group(2)) < 1):
            raise ConfigurationError(
                f"--hosts: {item!r} is not HOST or HOST:PROCESSES with PROCESSES >= 1; "
                "write them like --hosts node1:4,node2:4."
            )
        hosts.append((match.group(1), int(match.group(2) or 1)))
    names = [h for h, _ in hosts]
    if not hosts or len(set(names)) != len(names):
        raise ConfigurationError(f"--hosts {text!r}: give each host once, like --hosts node1:4,node2:4.")
    return hosts


def parse_elastic(text: str) -> tuple[int, int]:
    """``"1:2"`` -> ``(1, 2)``: the fewest and the most processes of an elastic job."""
    match = re.fullmatch(r"(\d+):(\d+)", text.strip())
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
        raise ConfigurationError(
            f"--elastic {text!r}: write MIN:MAX processes with 1 <= MIN <= MAX, like --elastic 1:2."
        )
    return int(match.group(1)), int(match.group(2))


def _elastic_plan(
    backend: str, requested: str, nproc: Optional[int], elastic: str, max_restarts: int, job_dir: str, must_exist: bool
) -> tuple[str, list, dict, int]:
    """An elastic job on this host: its launcher, its command (the script not yet added), the files
    it needs and its starting number of processes."""
    low, high = parse_elastic(elastic)
    nproc = nproc or high
    if not low <= nproc <= high:
        raise ConfigurationError(f"-n {nproc} is outside --elastic {elastic}; start with MIN <= -n <= MAX processes.")
    if max_restarts < 0:
        raise ConfigurationError(f"--max-restarts must not be negative, got {max_restarts}.")
    able = [tool for tool in _backend_class(backend).launch_programs() if launcher_for_tool(tool).recovery]
    chosen = (able or [None])[0] if requested == "auto" else requested
    if chosen is None:
        raise ConfigurationError(f"backend {backend!r} has no elastic launcher; use --backend ddp or horovod.")
    launcher = launcher_for_tool(chosen)
    script = launcher.discovery_script(high)
    discovery = os.path.join(job_dir, "discover-hosts.sh")
    argv = launcher.elastic_launch_command(
        sys.executable,
        nproc,
        low,
        high,
        [],
        port=None,
        discovery=discovery,
        max_restarts=max_restarts,
        must_exist=must_exist,
    )
    return chosen, argv, ({discovery: script} if script else {}), nproc


def _backend_class(backend: str) -> type:
    from ..core.registry import spec

    return spec(backend).load()


def choose_launcher(backend: str, requested: str, env: Mapping[str, str] = os.environ) -> str:
    """`requested`, or for "auto": srun inside a SLURM allocation, else the backend's first launcher here.

    A backend's later launchers are fallbacks for a first one not installed here (horovod:
    mpirun, else horovodrun --gloo).
    """
    if requested != "auto":  # launch_command names the launchers when it knows none of that name
        return requested
    preferred = _backend_class(backend).launch_programs()
    allocation = next((x.tool for x in registered_launchers() if x.tool and x.inside_an_allocation(env)), None)
    if allocation and not launcher_for_tool(preferred[0]).is_plain and find_tool(allocation):
        return allocation
    for name in preferred:
        if launcher_for_tool(name).comes_with_torch or find_tool(name):
            return name
    return preferred[0]  # building its command names what to install


def job_environment(launcher: str, nproc_here: int, env: Mapping[str, str] = os.environ) -> dict:
    """Variables to remove (None) or set for the job: no parent job's ranks; MPI yields on full cores."""
    changes: dict = {
        k: None
        for k in launcher_variables(env)
        if not k.startswith("SLURM_") or k in _SLURM_TASK  # a parent job's rank is not this job's
    }
    if launcher_for_tool(launcher).mpi and MPI_YIELD not in env and nproc_here >= cores():
        # Ranks fill every core (horovod adds a thread each): Open MPI's busy polling would starve
        # the other threads, and it yields by itself only when it knows it is oversubscribed.
        changes[MPI_YIELD] = "1"
    return changes


def plan_run(
    script: Sequence[str],
    nproc: Optional[int],
    backend: Optional[str],
    launcher: str = "auto",
    hosts: Optional[str] = None,
    port: Optional[int] = None,
    must_exist: bool = True,
    env: Mapping[str, str] = os.environ,
    horovod_api: bool = False,
    elastic: Optional[str] = None,
    max_restarts: int = 3,
    job_dir: str = "JOB_DIR",
) -> RunPlan:
    """Plan ``paraflow run``: pick the launcher, hand the backend to `script`, build every command.

    Args:
        script: the Python file and its arguments.
        nproc: total processes (None: the sum over `hosts`, else 1).
        backend: the backend name (None: PARAFLOW_BACKEND, else ddp for several processes, else
            single). The job gets it as PARAFLOW_BACKEND, which ``paraflow.init()`` reads, so
            the script parses nothing; mpirun forwards it to other hosts with ``-x``.
        launcher: "auto" or one of RUN_LAUNCHERS.
        hosts: "h1:2,h2:2" for a multi-host job (None: this host).
        port: rendezvous port of a multi-host torchrun job (default 29500).
        must_exist: False prints launchers missing here by their bare names (``--dry-run``).
        horovod_api: make ``import horovod.torch`` in the job's processes import
            ``paraflow.compat.horovod`` (:mod:`paraflow.tools.horovod_api`), through PYTHONPATH.
        elastic: "MIN:MAX" processes: a job on this host that survives lost workers (the script
            uses paraflow.elastic): horovodrun's elastic mode for horovod, with a host-discovery
            script written to `job_dir`, else torchrun with `max_restarts` restarts.

    Raises:
        BackendUnavailableError: a job on this host only (no `hosts`, not a dry run) with a
            backend that cannot run here, for the reason ``paraflow backends`` gives: refused
            before any process starts.
    """
    if not script:
        raise ConfigurationError("paraflow run needs a script: paraflow run -n 2 train.py [ARGS...]")
    host_list = parse_hosts(hosts) if hosts else None
    total = sum(n for _, n in host_list) if host_list else None
    given, nproc = nproc, nproc or total or 1
    if nproc < 1:
        raise ConfigurationError(f"-n must be at least 1, got {nproc}.")
    if total is not None and total != nproc:
        raise ConfigurationError(f"-n {nproc} but --hosts {hosts} holds {total} processes; make them agree.")
    name = backend or env.get("PARAFLOW_BACKEND") or ("ddp" if nproc > 1 else "single")
    cls = _backend_class(name)
    if nproc > 1 and not cls.MULTI_PROCESS:
        raise ConfigurationError(
            f"backend {name!r} runs in one process; use -n 1, or a multi-process backend (--backend ddp)."
        )
    if must_exist and not host_list:
        _refuse_unavailable(name)
    if elastic:
        if host_list:
            raise ConfigurationError("--elastic starts a job on this host; for several hosts see docs/elastic.md.")
        chosen, argv, files, nproc = _elastic_plan(name, launcher, given, elastic, max_restarts, job_dir, must_exist)
        job_env = {BACKEND_VARIABLE: name, **job_environment(chosen, nproc, env)}
        if horovod_api:
            job_env.update(horovod_api_environment(env))
        return RunPlan([(None, argv + list(script))], job_env, files)
    chosen = choose_launcher(name, launcher, env)
    args = list(script)
    if host_list and launcher_for_tool(chosen).agent_per_host:  # one agent per host: a command for each
        commands = [
            (host, launch_command(chosen, nproc, args, port, hosts=host_list, node_rank=i, must_exist=must_exist))
            for i, (host, _) in enumerate(host_list)
        ]
    else:
        forward = [BACKEND_VARIABLE, *(["PYTHONPATH"] if horovod_api else [])] if host_list else []  # remote: -x
        command = launch_command(chosen, nproc, args, port, env_keys=forward, hosts=host_list, must_exist=must_exist)
        commands = [(None, command)]
    job_env = {BACKEND_VARIABLE: name, **job_environment(chosen, 0 if host_list else nproc, env)}
    if horovod_api:
        job_env.update(horovod_api_environment(env))
    return RunPlan(commands, job_env)


def _refuse_unavailable(name: str) -> None:
    from ..core.registry import unavailable_reason

    reason = unavailable_reason(name)
    if reason:
        raise BackendUnavailableError(
            f"backend {name!r} cannot run here, so no process was started: {reason}. "
            "`paraflow backends` lists what can run here."
        )


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of ``paraflow run``."""
    parser.add_argument(
        "-n", "--nprocs", type=int, default=None, help="processes in all (default: the sum over --hosts, else 1)"
    )
    parser.add_argument(
        "--backend",
        default=None,
        help="backend name: picks the launcher and is set as PARAFLOW_BACKEND for the script, whose paraflow.init() "
        "takes it (default: PARAFLOW_BACKEND, else ddp for -n above 1, else single)",
    )
    parser.add_argument(
        "--launcher",
        choices=RUN_LAUNCHERS,
        default="auto",
        help="auto: srun inside a SLURM allocation, else the backend's own (ddp: torchrun; horovod: mpirun, "
        "else horovodrun --gloo; single, dp: python)",
    )
    parser.add_argument("--hosts", default=None, help="processes per host, rank 0's host first: h1:2,h2:2")
    parser.add_argument(
        "--node-rank", type=int, default=None, help="torchrun with --hosts: this host's place (default: by host name)"
    )
    parser.add_argument("--port", type=int, default=None, help="rendezvous port of a multi-host torchrun job (29500)")
    parser.add_argument(
        "--job-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds the whole job may run before every process is killed (default: no limit)",
    )
    renamed(parser, "--timeout", use="--job-timeout")
    parser.add_argument(
        "--elastic",
        default=None,
        metavar="MIN:MAX",
        help="a job on this host that survives lost workers (the script uses paraflow.elastic): horovod under "
        "horovodrun --min-np MIN --max-np MAX, other backends under torchrun --max-restarts (docs/elastic.md)",
    )
    parser.add_argument(
        "--max-restarts", type=int, default=3, help="--elastic under torchrun: restarts of the workers (default 3)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the command(s) and exit")
    parser.add_argument(
        "--horovod-api",
        action="store_true",
        help="run a script written for Horovod unchanged: its `import horovod.torch` imports paraflow.compat.horovod, "
        "on the backend --backend names (Horovod need not be installed)",
    )
    parser.add_argument("script", help="the Python file to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    return parser


def run_from_args(args: argparse.Namespace) -> int:
    """Run ``paraflow run``; returns the job's exit status (2: bad arguments, 124: past --job-timeout)."""
    records = None if args.dry_run else new_job_directory()  # where the ranks on this host keep their last words
    try:
        plan = plan_run(
            [args.script, *args.args],
            args.nprocs,
            args.backend,
            args.launcher,
            args.hosts,
            args.port,
            must_exist=not args.dry_run,
            horovod_api=args.horovod_api,
            elastic=args.elastic,
            max_restarts=args.max_restarts,
            job_dir=str(records) if not args.dry_run else "JOB_DIR",
        )
        if args.dry_run:
            for path, text in plan.files.items():
                print(f"# {path}:\n" + "".join(f"#   {line}\n" for line in text.splitlines()), end="")
            for host, argv in plan.commands:
                print((f"# on {host}\n" if host else "") + plan.shown(argv))
            return 0
        argv = _command_for_this_host(plan, args.node_rank)
    except ParaflowError as exc:
        print(f"paraflow run: {exc}", file=sys.stderr)
        if records is not None:
            job_ended(records)
        return 2
    for path, text in plan.files.items():
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o755)
    removed = sorted(k for k, v in plan.env.items() if v is None)
    if removed:
        print(f"paraflow run: not passing on the parent job's {', '.join(removed)}", file=sys.stderr)
    print(f"paraflow run: {plan.shown(argv)}", flush=True)
    code = _execute(argv, {**plan.env, JOB_DIR_ENV: str(records)}, args.job_timeout)
    job_ended(records)
    return code


def _command_for_this_host(plan: RunPlan, node_rank: Optional[int]) -> list:
    if len(plan.commands) == 1:
        return plan.commands[0][1]
    hosts = [host for host, _ in plan.commands]
    if node_rank is None:
        names = {socket.gethostname(), socket.gethostname().split(".")[0], socket.getfqdn()}
        matches = [i for i, host in enumerate(hosts) if host in names]
        node_rank = matches[0] if len(matches) == 1 else None
    if node_rank is None or not 0 <= node_rank < len(hosts):
        shown = "\n".join(f"  on {host}: {plan.shown(argv)}" for host, argv in plan.commands)
        raise ConfigurationError(
            f"torchrun runs one agent per host; this host ({socket.gethostname()}) is not one of "
            f"{', '.join(hosts)}. Run `paraflow run ... --node-rank K` on host K, or these commands:\n{shown}"
        )
    return plan.commands[node_rank][1]


class _Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the launch waits so that it kills what it started."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum: int, frame: object) -> None:
    raise _Stopped(signum)


def _execute(argv: list, env: dict, timeout: Optional[float]) -> int:
    prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: adopt the launch's orphans, so that none escapes the final kill
    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        result = run_launch(argv, timeout, env=env, capture=False)
    except KeyboardInterrupt as stop:  # run_launch has killed the launch
        signum = getattr(stop, "signum", signal.SIGINT)
        print(f"paraflow run: {signal.Signals(signum).name}: every process of the job was killed", file=sys.stderr)
        return 128 + signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        kill_descendants(os.getpid())  # whatever a launcher left behind
    if result.timed_out:
        print(f"paraflow run: timed out after {timeout:g} s; every process of the job was killed", file=sys.stderr)
        return 124
    return result.returncode if result.returncode >= 0 else 128 - result.returncode
