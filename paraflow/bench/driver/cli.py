"""Arguments of `paraflow bench` (also `python benchmarks/run.py`)."""

from __future__ import annotations

import argparse

__all__ = ["add_arguments", "config_from_args", "main"]


def _list(text: str) -> list:
    return [t for t in text.replace(",", " ").split() if t]


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the benchmark's options to `p`."""
    from .config import DEFAULT_MARGIN, DEFAULT_MODELS

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
    p.add_argument(
        "--warmup", type=int, default=5, help="untimed steps first, at least; more until step times settle (default: 5)"
    )
    p.add_argument("--max-warmup", type=float, default=1.5, help="seconds of warm-up steps, at most (default: 1.5)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per window, at least (default: 20)")
    p.add_argument("--min-window", type=float, default=0.3, help="seconds per timed window, at least (default: 0.3)")
    p.add_argument("--repeat", type=int, default=3, help="independent launches of every training cell (default: 3)")
    p.add_argument(
        "--max-repeat",
        type=int,
        default=5,
        help="launches in all for a cell whose interval is still wider than --noisy after --repeat, while "
        "the time budget lasts (default: %(default)s; --max-repeat equal to --repeat: no extra launch)",
    )
    p.add_argument(
        "--time-budget",
        type=float,
        default=270.0,
        help="seconds of the run after which no extra launch starts; the abstraction overhead's pairs shrink "
        "(to 60 at least) when the planned launches would run past it (default: %(default)s)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads per process, the same at every process count (default: cores / largest process count)",
    )
    p.add_argument("--noisy", type=float, default=0.10, help="noisy mark: 95%% interval wider than this (default: 0.1)")
    p.add_argument(
        "--margin",
        type=float,
        default=DEFAULT_MARGIN,
        help="the smallest throughput difference the verdict calls, as a fraction (the A/A noise floor when "
        "larger; default: %(default)s)",
    )
    p.add_argument("--no-aa-check", dest="aa_check", action="store_false", help="skip the A/A noise-floor launches")
    p.add_argument(
        "--pin",
        choices=("auto", "on", "off"),
        default="auto",
        help="bind each rank to cores of its own (and gloo's polling event loop to idle priority): on, off, or "
        "auto = on unless other threads hold every core at the start (the run queue of /proc/loadavg), where "
        "pinned ranks cannot move off busy cores (default: auto)",
    )
    p.add_argument(
        "--omp-wait",
        choices=("active", "passive"),
        default="passive",
        help="OpenMP threads at barriers: passive (sleep) or active (spin) (default: passive; OMP_WAIT_POLICY in "
        "the environment wins)",
    )
    p.add_argument(
        "--scaling", type=_list, default=["weak"], metavar="MODES", help="weak, strong or weak,strong (default: weak)"
    )
    p.add_argument("--min-bytes", default="4K", help="smallest sweep message (default: 4K)")
    p.add_argument("--max-bytes", default="64M", help="largest sweep message (default: 64M)")
    p.add_argument("--step-factor", type=int, default=4, help="size multiplier between messages (default: 4)")
    p.add_argument(
        "--collectives",
        type=_list,
        default=["allreduce"],
        metavar="NAMES",
        help="collectives the sweep measures: allreduce, allgather, reduce_scatter, broadcast, or all "
        "(default: allreduce)",
    )
    p.add_argument(
        "--dtypes",
        type=_list,
        default=["float32"],
        metavar="NAMES",
        help="float32, float16, bfloat16 (default: float32)",
    )
    p.add_argument("--units", choices=("GB/s", "Gbit/s"), default="GB/s", help="bandwidth unit (default: GB/s)")
    p.add_argument(
        "--sweep-rounds",
        type=int,
        default=12,
        help="alternating raw / paraflow pairs per sweep size, at least: more resolve paraflow/raw finer (default: 12)",
    )
    p.add_argument(
        "--overhead-steps",
        type=int,
        default=150,
        help="paraflow/raw/control step pairs for the abstraction overhead (default: 150)",
    )
    p.add_argument(
        "--overhead-seconds",
        type=float,
        default=8.0,
        help="fewer overhead pairs when they would take longer than this, or than --time-budget leaves them, "
        "at least 60 (default: 8)",
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
        help="skip the collective sweep and memory-copy bandwidth",
    )
    p.add_argument("--no-overhead", dest="overhead", action="store_false", help="skip the abstraction overhead")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--trace",
        action="store_true",
        help="one more launch per multi-process backend and launcher, writing a torch.profiler Chrome trace "
        "per rank (and horovod's timeline) under OUT/traces/",
    )
    p.add_argument(
        "--tune",
        action="store_true",
        help="also launch DDP's bucket_cap_mb x gradient_as_bucket_view and horovod's fusion_threshold_mb x "
        "cycle_time_ms settings at the largest process count; the tables gain a tuned row per backend",
    )
    p.add_argument(
        "--tune-values",
        action="append",
        default=[],
        metavar="KNOB=V1,V2",
        help="values to try for one knob instead of the built-in ones (repeatable), e.g. bucket_cap_mb=1,25",
    )
    p.add_argument(
        "--tune-seconds",
        type=float,
        default=300.0,
        help="stop launching tuning settings once they have taken this long (default: 300)",
    )
    p.add_argument(
        "--cluster",
        type=int,
        default=0,
        metavar="HOSTS",
        help="run on an emulated cluster of HOSTS network namespaces, one rank per host (root)",
    )
    p.add_argument("--bandwidth", default=None, help="rate of each emulated host link, e.g. 1gbit (with --cluster)")
    p.add_argument(
        "--compare",
        nargs=2,
        metavar=("RUN_A", "RUN_B"),
        help="run nothing: print two results folders' medians side by side with their intervals "
        "and whether their verdicts match",
    )
    p.add_argument(
        "--project-only",
        metavar="RUN",
        help="run nothing: fit the cost model to a results folder and project it to many hosts",
    )
    return p


def config_from_args(args: argparse.Namespace):
    """A BenchConfig from parsed arguments."""
    from ...errors import ConfigurationError
    from .config import COLLECTIVES, BenchConfig, message_sizes, parse_size
    from .tune import parse_tune_values

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
        max_warmup=args.max_warmup,
        repeat=args.repeat,
        max_repeat=max(args.max_repeat, args.repeat),
        time_budget=args.time_budget,
        threads=args.threads,
        noisy=args.noisy,
        margin=args.margin,
        aa_check=args.aa_check,
        pin=args.pin,
        omp_wait=args.omp_wait,
        scaling=args.scaling,
        collectives=list(COLLECTIVES) if args.collectives == ["all"] else args.collectives,
        dtypes=args.dtypes,
        units=args.units,
        sweep_rounds=args.sweep_rounds,
        sizes=message_sizes(parse_size(args.min_bytes), parse_size(args.max_bytes), args.step_factor),
        overhead_steps=args.overhead_steps,
        overhead_seconds=args.overhead_seconds,
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
        trace=args.trace,
        tune=args.tune,
        tune_values=parse_tune_values(args.tune_values),
        tune_seconds=args.tune_seconds,
    )


def run_from_args(args: argparse.Namespace) -> int:
    """Run the benchmark (exit status 0 when every launch succeeded), or compare two runs."""
    if args.compare:
        from ..report.compare import compare_main

        return compare_main(*args.compare)
    if args.project_only:
        from ..report.project_cli import project_main

        return project_main(args.project_only, plots=args.plots)
    from .run import exit_status, run_bench

    return exit_status(run_bench(config_from_args(args)))


def main(argv=None) -> int:
    parser = add_arguments(
        argparse.ArgumentParser(
            prog="paraflow bench", description="Compare every data-parallel backend available here."
        )
    )
    return run_from_args(parser.parse_args(argv))
