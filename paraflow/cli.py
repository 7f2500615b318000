"""The `paraflow` command: list backends, check this machine, run a script, benchmark them."""

from __future__ import annotations

import argparse
import sys


def _backends(args: argparse.Namespace) -> int:
    from .core.registry import available_backends

    for name, reason in available_backends().items():
        print(f"{name:10s} {'available' if reason is None else 'unavailable: ' + reason}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from .bench.driver.cli import run_from_args

    return run_from_args(args)


def _check(args: argparse.Namespace) -> int:
    if args.comm or args.backend or args.nprocs is not None or args.timeout is not None:
        from .tools.comm_check import run_from_args as comm_check

        return comm_check(args)
    from .tools.check import main as check_main

    return check_main(as_json=args.json, json_dir=args.json_dir)


def _run(args: argparse.Namespace) -> int:
    from .tools.run import run_from_args

    return run_from_args(args)


def _build_horovod(args: argparse.Namespace) -> int:
    from .backends.horovod.build import build_and_install

    return build_and_install(args.python, args.force)


def _cluster(args: argparse.Namespace) -> int:
    from .tools.cluster.cli import main as cluster_main

    return cluster_main(args)


def build_parser() -> argparse.ArgumentParser:
    """The whole ``paraflow`` command line (the docs' CLI reference is generated from it)."""
    parser = argparse.ArgumentParser(prog="paraflow", description=__doc__)
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
    from .tools.comm_check import add_arguments as add_comm_arguments

    add_comm_arguments(check).set_defaults(func=_check)
    from .tools.run import add_arguments as add_run_arguments

    add_run_arguments(
        sub.add_parser("run", help="start a script under the launcher its backend wants (torchrun, mpirun, ...)")
    ).set_defaults(func=_run)
    from .backends.horovod.build import add_arguments as add_build_arguments

    add_build_arguments(
        sub.add_parser("build-horovod", help="build horovod against this torch (MPI and gloo), cached, and install it")
    ).set_defaults(func=_build_horovod)
    from .bench.driver.cli import add_arguments as add_bench_arguments

    bench = sub.add_parser("bench", help="benchmark every backend available here: tables, CSV, JSON, plots")
    add_bench_arguments(bench).set_defaults(func=_bench)
    from .tools.cluster.cli import add_arguments as add_cluster_arguments

    cluster = sub.add_parser("cluster", help="an emulated multi-host cluster on this machine (root): up, exec, down")
    add_cluster_arguments(cluster).set_defaults(func=_cluster)
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
