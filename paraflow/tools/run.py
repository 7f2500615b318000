"""``paraflow run``: start a script under the launcher its backend wants; end every process it started.

The command is printed before it runs (``--dry-run`` prints only), the job's exit status becomes
this command's, and Ctrl-C, SIGTERM, SIGHUP or ``--job-timeout`` kill the launcher and every process
below it: the launch runs in a session of its own, and this process adopts (Linux subreaper) and
kills whatever a launcher leaves behind.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from typing import Optional

from ..errors import ConfigurationError, ParaflowError
from .flags import deprecated_alias
from .launch import kill_descendants, run_launch
from .run_plan import RUN_LAUNCHERS, RunPlan, plan_run

__all__ = ["add_arguments", "run_from_args"]


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
    deprecated_alias(parser, "--timeout", "--job-timeout")
    parser.add_argument("--dry-run", action="store_true", help="print the command(s) and exit")
    parser.add_argument("script", help="the Python file to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    return parser


def run_from_args(args: argparse.Namespace) -> int:
    """Run ``paraflow run``; returns the job's exit status (2: bad arguments, 124: past --job-timeout)."""
    try:
        plan = plan_run(
            [args.script, *args.args],
            args.nprocs,
            args.backend,
            args.launcher,
            args.hosts,
            args.port,
            must_exist=not args.dry_run,
        )
        if args.dry_run:
            for host, argv in plan.commands:
                print((f"# on {host}\n" if host else "") + plan.shown(argv))
            return 0
        argv = _command_for_this_host(plan, args.node_rank)
    except ParaflowError as exc:
        print(f"paraflow run: {exc}", file=sys.stderr)
        return 2
    removed = sorted(k for k, v in plan.env.items() if v is None)
    if removed:
        print(f"paraflow run: not passing on the parent job's {', '.join(removed)}", file=sys.stderr)
    print(f"paraflow run: {plan.shown(argv)}", flush=True)
    return _execute(argv, plan.env, args.job_timeout)


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


def _become_subreaper() -> None:
    """Adopt the orphans of the launch (Linux), so that none escapes the final kill."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def _execute(argv: list, env: dict, timeout: Optional[float]) -> int:
    _become_subreaper()
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
