"""The `paraflow` command: list backends, check this machine, run a script, benchmark them."""

from __future__ import annotations

import argparse
import sys

from .tools.flags import renamed


def _backends(args: argparse.Namespace) -> int:
    from .core.registry import available_backends

    for name, reason in available_backends().items():
        print(f"{name:10s} {'available' if reason is None else 'unavailable: ' + reason}")
    return 0


def _check(args: argparse.Namespace) -> int:
    if getattr(args, "check_command", None) == "comm":
        from .tools.comm_check import run_from_args as comm_check

        return comm_check(args)
    from .tools.check import main as check_main

    return check_main(as_json=args.json, json_dir=args.json_dir)


def _build_horovod(args: argparse.Namespace) -> int:
    from .backends.horovod.build import build_and_install

    return build_and_install(args.python, args.force)


def build_parser() -> argparse.ArgumentParser:
    """The whole ``paraflow`` command line (the docs' CLI reference is generated from it)."""
    from . import __version__

    parser = argparse.ArgumentParser(prog="paraflow", description=__doc__)
    parser.add_argument("--version", action="version", version=f"paraflow {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("backends", help="list registered backends and whether each can run here").set_defaults(
        func=_backends
    )
    check = sub.add_parser(
        "check",
        aliases=["env"],
        help="what this machine can run: torch, GPUs, MPI, horovod, this process's launcher and rank, every backend",
    )
    check.add_argument("--json", action="store_true", help="print one line of JSON per process")
    check.add_argument(
        "--json-dir",
        metavar="DIR",
        default=None,
        help="write each process's JSON report to DIR/rank<R>.json (lines printed at once by several "
        "processes can interleave as a launcher forwards them)",
    )
    # The old spelling of `check comm`: `check --comm -n N --backend B --timeout S`.
    renamed(check, "--comm", use="paraflow check comm")
    renamed(check, "-n", "--nprocs", use="paraflow check comm -n")
    renamed(check, "--backend", use="paraflow check comm --backend")
    renamed(check, "--timeout", use="paraflow check comm --wait-timeout")
    check.set_defaults(func=_check, check_command=None)
    check_sub = check.add_subparsers(dest="check_command", metavar="{comm}")
    from .tools.comm_check import add_arguments as add_comm_arguments

    add_comm_arguments(
        check_sub.add_parser(
            "comm", help="live test: run four collectives on every backend that can run here, in new processes"
        )
    )
    from .tools import run

    run.add_arguments(
        sub.add_parser("run", help="start a script under the launcher its backend wants (torchrun, mpirun, ...)")
    ).set_defaults(func=run.run_from_args)
    from .backends.horovod.build import add_arguments as add_build_arguments

    add_build_arguments(
        sub.add_parser("build-horovod", help="build horovod against this torch (MPI and gloo), cached, and install it")
    ).set_defaults(func=_build_horovod)
    from .bench.driver import cli as bench

    bench.add_arguments(
        sub.add_parser("bench", help="benchmark every backend available here: tables, CSV, JSON, plots")
    ).set_defaults(func=bench.run_from_args)
    from .tools import cluster

    cluster.add_arguments(
        sub.add_parser("cluster", help="an emulated multi-host cluster on this machine (root): up, exec, down")
    ).set_defaults(func=cluster.main)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from .errors import ConfigurationError

    try:
        return args.func(args)
    except ConfigurationError as exc:  # bad input: the message says what to fix, a traceback would bury it
        print(f"paraflow {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
