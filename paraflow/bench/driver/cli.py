"""Arguments of `paraflow bench` (also `python benchmarks/run.py`)."""

from __future__ import annotations

import argparse

__all__ = ["add_arguments", "config_from_args", "main"]


def _list(text: str) -> list:
    return [t for t in text.replace(",", " ").split() if t]


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the benchmark's options to `p`."""
    from .config import DEFAULT_MODELS

    p.add_argument(
        "--backends",
        type=_list,
        default=None,
        metavar="NAMES",
        help="comma-separated backends (default: every one that can run here; single always runs)",
    )
    p.add_argument(
        "--nprocs",
        type=_list,
        default=["1", "2"],
        metavar="COUNTS",
        help="process counts for multi-process backends (default: 1,2)",
    )
    p.add_argument(
        "--models",
        nargs="+",
        default=list(DEFAULT_MODELS),
        metavar="SPEC",
        help="models as name[:key=value,...] (default: %(default)s)",
    )
    p.add_argument("--data", choices=("synthetic", "digits"), default="synthetic")
    p.add_argument("--batch-size", type=int, default=32, help="samples per process per step (default: 32)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (default: 5)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per window, at least (default: 20)")
    p.add_argument(
        "--min-window",
        type=float,
        default=1.0,
        help="seconds each timed window lasts, at least: short steps get more of them (default: 1)",
    )
    p.add_argument("--min-bytes", default="4K", help="smallest allreduce message (default: 4K)")
    p.add_argument("--max-bytes", default="64M", help="largest allreduce message (default: 64M)")
    p.add_argument("--step-factor", type=int, default=4, help="size multiplier between messages (default: 4)")
    p.add_argument(
        "--overhead-steps",
        type=int,
        default=40,
        help="paraflow/raw step pairs for the abstraction overhead (default: 40)",
    )
    p.add_argument("--overhead-model", default=None, help="model for the abstraction overhead (default: first)")
    p.add_argument(
        "--launchers",
        type=_list,
        default=None,
        metavar="NAMES",
        help="only these launchers (python, torchrun, mpirun, horovodrun)",
    )
    p.add_argument("--timeout", type=float, default=150.0, help="seconds per launch (default: 150)")
    p.add_argument("--out", default="bench-results", help="results folder (default: bench-results)")
    p.add_argument("--no-plots", dest="plots", action="store_false", help="skip the PNG plots")
    p.add_argument(
        "--no-allreduce",
        dest="allreduce",
        action="store_false",
        help="skip the allreduce microbenchmark and memory-copy bandwidth",
    )
    p.add_argument("--no-overhead", dest="overhead", action="store_false", help="skip the abstraction overhead")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--cluster",
        type=int,
        default=0,
        metavar="HOSTS",
        help="run on an emulated cluster of HOSTS network namespaces, one rank per host (root)",
    )
    p.add_argument("--bandwidth", default=None, help="rate of each emulated host link, e.g. 1gbit (with --cluster)")
    return p


def config_from_args(args: argparse.Namespace):
    """A BenchConfig from parsed arguments."""
    from ...errors import ConfigurationError
    from .config import BenchConfig, message_sizes, parse_size

    try:
        nprocs = [int(n) for n in args.nprocs]
    except ValueError:
        raise ConfigurationError(f"--nprocs {','.join(args.nprocs)}: give integers, e.g. --nprocs 1,2.") from None
    return BenchConfig(
        backends=args.backends,
        nprocs=nprocs,
        models=args.models,
        data=args.data,
        batch_size=args.batch_size,
        warmup=args.warmup,
        steps=args.steps,
        min_window=args.min_window,
        sizes=message_sizes(parse_size(args.min_bytes), parse_size(args.max_bytes), args.step_factor),
        overhead_steps=args.overhead_steps,
        overhead_model=args.overhead_model,
        launchers=args.launchers,
        timeout=args.timeout,
        out=args.out,
        plots=args.plots,
        allreduce=args.allreduce,
        overhead=args.overhead,
        seed=args.seed,
        cluster=args.cluster,
        bandwidth=args.bandwidth,
    )


def run_from_args(args: argparse.Namespace) -> int:
    """Run the benchmark; exit status 0 when every launch succeeded."""
    from .run import exit_status, run_bench

    return exit_status(run_bench(config_from_args(args)))


def main(argv=None) -> int:
    parser = add_arguments(
        argparse.ArgumentParser(
            prog="paraflow bench", description="Compare every data-parallel backend available here."
        )
    )
    return run_from_args(parser.parse_args(argv))
