"""Arguments of `paraflow bench` (also `python benchmarks/run.py`).

    paraflow bench [OPTIONS]                       run the benchmark (the default mode)
    paraflow bench --script train.py [-- ARGS]     time your own paraflow script instead of the built-in loop
    paraflow bench project RUN                     the cost model of a results folder, projected to many hosts

List options (--backend, --launcher, --nprocs, --model) take a comma list or repeat.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields

from ...tools.flags import renamed

__all__ = ["add_arguments", "config_from_args", "run_from_args", "split_models", "RENAMED"]

#: Old spelling -> new spelling; an old one is an error naming the new one.
RENAMED = {
    "--backends": "--backend",
    "--launchers": "--launcher",
    "--models": "--model",
    "--project-only": "paraflow bench project RUN",
    "--steps": "--window-steps",
    "--timeout": "--launch-timeout",
    "--cluster": "--nodes",
}


def _list(text: str) -> list:
    return [t for t in text.replace(",", " ").split() if t]


def split_models(text: str) -> list:
    """Model specs from one --model value: `mlp,cnn` is two specs, but `transformer:width=128,depth=4`
    and `mypkg.models:build:hidden=40,depth=2` are one each (a `key=value` piece without a colon
    continues the spec before it)."""
    specs: list = []
    for piece in filter(None, (p.strip() for p in text.split(","))):
        if specs and "=" in piece and ":" not in piece:
            specs[-1] += "," + piece
        else:
            specs.append(piece)
    return specs


def _split_script_args(parse_known_args):
    """Wrap a parser's parse_known_args so that everything after `--` becomes `script_args`
    (the arguments of the --script), untouched by the parser."""

    def parse(args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        rest: list = []
        if "--" in args:
            cut = args.index("--")
            args, rest = args[:cut], args[cut + 1 :]
        namespace, extra = parse_known_args(args, namespace)
        namespace.script_args = rest
        return namespace, extra

    return parse


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the benchmark's options and its project mode to `p`."""
    from ..report.verdict import DEFAULT_MARGIN
    from .config import DEFAULT_MODELS

    p.description = p.description or __doc__.splitlines()[0]
    p.epilog = (
        "mode: `paraflow bench project RUN` (see its --help). "
        "List options take a comma list or repeat: --backend ddp-gloo,horovod = --backend ddp-gloo --backend horovod."
    )
    p.parse_known_args = _split_script_args(p.parse_known_args)
    p.set_defaults(mode="run", script_args=[])

    what = p.add_argument_group("what to measure")
    _list_flag(
        what,
        "--backend",
        "NAME[,NAME]",
        "backends to run (default: every one that can run here; single, the baseline, always runs)",
    )
    _list_flag(
        what,
        "--launcher",
        "NAME[,NAME]",
        "only these launchers: python, torchrun, mpirun, horovodrun (default: each backend's own)",
    )
    _list_flag(what, "-n", "N[,N]", "process counts for multi-process backends (default: 1,2)", "--nprocs")
    what.add_argument(
        "--model",
        type=split_models,
        action="extend",
        default=None,
        metavar="SPEC",
        help="a built-in model NAME[:key=value,...] (mlp, cnn, transformer) or your factory "
        "MODULE:FUNCTION[:key=value,...], importable from here or PYTHONPATH, returning an nn.Module "
        "(with --input-shape) or (model, (inputs, targets)) "
        f"(default: {','.join(DEFAULT_MODELS)})",
    )
    what.add_argument(
        "--input-shape",
        type=_shape,
        default=None,
        metavar="C,H,W",
        help="one sample's shape, for a factory that returns a bare nn.Module: the benchmark makes a synthetic "
        "classification batch of --batch-size such samples",
    )
    what.add_argument(
        "--classes",
        type=int,
        default=10,
        metavar="N",
        help="classes of that synthetic batch's integer targets (default: 10)",
    )
    what.add_argument(
        "--script",
        default=None,
        metavar="PATH",
        help="time your own paraflow training script (one that calls paraflow.init() with no name) under each "
        "backend and launcher instead of the built-in loop; its arguments go after `--`",
    )
    what.add_argument(
        "--horovod-api",
        action="store_true",
        help="the --script is written for Horovod: its `import horovod.torch` imports paraflow.compat.horovod, "
        "so it runs on every backend (as paraflow run --horovod-api)",
    )
    what.add_argument(
        "--data",
        choices=("synthetic", "digits"),
        default="synthetic",
        help="data of the built-in models (default: synthetic)",
    )
    what.add_argument("--batch-size", type=int, default=32, help="samples per process per step (default: 32)")
    what.add_argument(
        "--compile",
        type=_list,
        nargs="?",
        const=["no", "yes"],
        default=["no"],
        metavar="no,yes",
        help="train eager (no), compiled with torch.compile through wrap_model(model, compile=True) (yes), or both "
        "side by side; --compile alone means no,yes (default: no)",
    )
    what.add_argument(
        "--scaling", type=_list, default=["weak"], metavar="MODES", help="weak, strong or weak,strong (default: weak)"
    )
    what.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads per process, the same at every process count (default: cores / largest process count)",
    )

    timing = p.add_argument_group("timing and repeats")
    timing.add_argument(
        "--warmup", type=int, default=5, help="untimed steps first, at least; more until step times settle (default: 5)"
    )
    timing.add_argument(
        "--max-warmup", type=float, default=1.5, help="seconds of warm-up steps, at most (default: 1.5)"
    )
    timing.add_argument(
        "--window-steps", dest="steps", type=int, default=20, help="timed steps per window, at least (default: 20)"
    )
    timing.add_argument(
        "--min-window", type=float, default=0.3, help="seconds per timed window, at least (default: 0.3)"
    )
    timing.add_argument(
        "--repeat", type=int, default=3, help="independent launches of every training cell (default: 3)"
    )
    timing.add_argument(
        "--max-repeat",
        type=int,
        default=5,
        help="launches in all for a cell whose interval is still wider than --noisy after --repeat, while "
        "the time budget lasts (default: %(default)s; --max-repeat equal to --repeat: no extra launch)",
    )
    timing.add_argument(
        "--time-budget",
        type=float,
        default=270.0,
        help="seconds of the run after which no extra launch starts (default: %(default)s)",
    )
    timing.add_argument(
        "--launch-timeout", dest="timeout", type=float, default=150.0, help="seconds per launch (default: 150)"
    )
    timing.add_argument("--seed", type=int, default=0, help="model initialisation and data seed (default: 0)")

    stats = p.add_argument_group("statistics")
    stats.add_argument(
        "--noisy", type=float, default=0.10, help="noisy mark: 95%% interval wider than this (default: 0.1)"
    )
    stats.add_argument(
        "--margin",
        type=float,
        default=DEFAULT_MARGIN,
        help="the smallest throughput difference the verdict calls, as a fraction (the A/A noise floor when "
        "larger; default: %(default)s)",
    )
    stats.add_argument("--no-aa-check", dest="aa_check", action="store_false", help="skip the A/A noise-floor launches")

    machine = p.add_argument_group("machine")
    machine.add_argument(
        "--nodes",
        dest="cluster",
        type=int,
        default=0,
        metavar="HOSTS",
        help="run on an emulated cluster of HOSTS network namespaces, one rank per host (root)",
    )
    machine.add_argument("--bandwidth", default=None, help="rate of each emulated host link, e.g. 1gbit (with --nodes)")

    sweep = p.add_argument_group("collectives sweep")
    sweep.add_argument(
        "--no-allreduce",
        dest="allreduce",
        action="store_false",
        help="skip the collective sweep",
    )
    sweep.add_argument(
        "--collectives",
        type=_list,
        default=["allreduce"],
        metavar="NAMES",
        help="collectives the sweep measures: allreduce, allgather, reduce_scatter, broadcast, or all "
        "(default: allreduce)",
    )
    sweep.add_argument("--min-bytes", default="4K", help="smallest sweep message (default: 4K)")
    sweep.add_argument("--max-bytes", default="64M", help="largest sweep message (default: 64M)")

    output = p.add_argument_group("output")
    output.add_argument("--out", default="bench-results", help="results folder (default: bench-results)")
    output.add_argument("--no-plots", dest="plots", action="store_false", help="skip throughput.png")

    for old, new in RENAMED.items():
        renamed(p, old, use=new)

    modes = p.add_subparsers(
        dest="mode",
        metavar="{project}",
        title="modes (default: run the benchmark)",
        parser_class=argparse.ArgumentParser,
    )
    project = modes.add_parser(
        "project", help="run nothing: fit the cost model to a results folder and project it to many hosts"
    )
    project.add_argument("run", metavar="RUN", help="a results folder (or its results.json)")
    return p


def _list_flag(group, flag: str, metavar: str, help: str, *more: str) -> None:
    """A list option: a comma list, or repeated (the values add up)."""
    group.add_argument(flag, *more, type=_list, action="extend", default=None, metavar=metavar, help=help)


def _shape(text: str) -> tuple:
    try:
        shape = tuple(int(t) for t in _list(text))
    except ValueError:
        shape = ()
    if not shape or any(s < 1 for s in shape):
        raise argparse.ArgumentTypeError(f"{text!r} is not a sample shape like 3,224,224 (positive integers)")
    return shape


def config_from_args(args: argparse.Namespace):
    """A BenchConfig from parsed arguments."""
    from ...errors import ConfigurationError
    from .config import COLLECTIVES, DEFAULT_MODELS, BenchConfig, message_sizes, parse_size

    nprocs = args.nprocs or ["1", "2"]
    try:
        nprocs = [int(n) for n in nprocs]
    except ValueError:
        raise ConfigurationError(f"--nprocs {','.join(nprocs)}: give integers, e.g. --nprocs 1,2.") from None
    if args.script_args and not args.script:
        raise ConfigurationError(
            f"arguments after `--` ({' '.join(args.script_args)}) are a script's: add --script PATH before them."
        )
    values = {f.name: getattr(args, f.name) for f in fields(BenchConfig) if hasattr(args, f.name)}
    values.update(
        backends=args.backend,
        launchers=args.launcher,
        nprocs=nprocs,
        models=args.model or list(DEFAULT_MODELS),
        max_repeat=max(args.max_repeat, args.repeat),
        collectives=list(COLLECTIVES) if args.collectives == ["all"] else args.collectives,
        sizes=message_sizes(parse_size(args.min_bytes), parse_size(args.max_bytes)),
    )
    return BenchConfig(**values)


def run_from_args(args: argparse.Namespace) -> int:
    """Run the benchmark (exit status 0 when every launch succeeded), or project a finished run."""
    mode = getattr(args, "mode", None) or "run"
    if mode == "project":
        from ..report.project import project_main

        return project_main(args.run)
    from .run import run_bench

    results = run_bench(config_from_args(args))
    return 0 if all(c["status"] == "ok" for c in results["cells"]) else 1
