"""``paraflow check comm``: does communication actually work here? A live test of every backend.

For each backend that can run on this machine, N fresh processes (``paraflow.launch``'s workers)
meet at rank 0's address, start the backend and run allreduce, broadcast, allgather and barrier
with known values (:mod:`paraflow.tools.comm_rank`). Per backend it prints ok or the failure, the
median time per call (slowest rank), the interface and addresses used, and the ranks that never
arrived within the timeout. The exit status is 1 when any backend failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, TextIO

from ..errors import ParaflowError
from .comm_rank import COLLECTIVES, check_rank
from .flags import deprecated_alias
from .spawn import run_workers

__all__ = ["add_arguments", "run_checks", "run_from_args", "render"]

DEFAULT_TIMEOUT = 30.0
_STARTUP_S = 60  # interpreter, torch and horovod imports before a rank can arrive, on a loaded host


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of ``paraflow check comm``."""
    parser.add_argument(
        "-n", "--nprocs", type=int, default=None, help="processes per multi-process backend, in all (default 2)"
    )
    parser.add_argument(
        "--backend",
        action="append",
        default=None,
        help="check only these backends (repeat, or a comma list: a,b,c; default: every one that can run here)",
    )
    parser.add_argument(
        "--wait-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"seconds to wait for the ranks to arrive and for each collective (default {DEFAULT_TIMEOUT:g})",
    )
    deprecated_alias(parser, "--timeout", "--wait-timeout")
    parser.add_argument("--json", action="store_true", help="print every result as one line of JSON")
    return parser


def run_checks(
    backends: Optional[list] = None,
    nprocs: int = 2,
    timeout: float = DEFAULT_TIMEOUT,
    rank_env: Optional[dict] = None,
    out: Optional[TextIO] = None,
) -> list[dict]:
    """Check each backend (default: every registered one); returns one result per backend.

    Args:
        backends: names to check; unknown ones raise UnknownBackendError.
        nprocs: processes for a multi-process backend (one-process backends get one).
        timeout: seconds ranks may take to arrive, and each collective to complete.
        rank_env: extra variables per rank (rank -> {name: value}), to test a broken rank.
        out: where to print each result as it comes (None: print nothing).
    """
    from ..core.registry import available_backends, registered_names, spec

    names = backends or registered_names()
    for name in names:
        spec(name)  # unknown names fail before anything starts
    reasons = available_backends()
    results = []
    for name in names:
        if reasons.get(name):
            result = {"backend": name, "status": "skipped", "reason": reasons[name]}
        else:
            n = nprocs if spec(name).load().MULTI_PROCESS else 1
            outcomes = run_workers(
                check_rank,
                (name, timeout),
                n,
                time_limit=3 * timeout + _STARTUP_S,
                stream=False,
                stop_on_failure=False,
                rank_env=rank_env,
            )
            result = summarize(name, n, timeout, outcomes)
        results.append(result)
        if out is not None:
            out.write(render(result) + "\n")
            out.flush()
    return results


def summarize(name: str, n: int, timeout: float, outcomes: list) -> dict:
    """One backend's result from its ranks' reports (or their deaths)."""
    reports = {o.rank: o.value for o in outcomes if o.status == "ok"}
    problems = []
    for o in outcomes:
        if o.status != "ok":
            how = o.summary() if o.status != "unfinished" else "still running at the time limit (killed)"
            tail = " / ".join(list(o.tail)[-3:])
            problems.append(f"rank {o.rank}: {how}" + (f" [{tail}]" if tail else ""))
        elif o.value.get("error"):
            problems.append(f"rank {o.rank}: {o.value['error']}")
        elif o.value.get("wrong"):
            problems.append(f"rank {o.rank}: wrong result from {', '.join(o.value['wrong'])}")
    never = sorted(reports.get(0, {}).get("missing") or [])  # rank 0 waited for them at its address
    times = {
        c: max(r["times_ms"][c] for r in reports.values())
        for c in COLLECTIVES
        if len(reports) == n and all(c in r.get("times_ms", {}) for r in reports.values())
    }
    return {
        "backend": name,
        "status": "failed" if problems else "ok",
        "processes": n,
        "times_ms": times,
        "never_arrived": never if problems else [],
        "problems": problems,
        "timeout_s": timeout,
        "ranks": [reports.get(r) for r in range(n)],
    }


def render(result: dict) -> str:
    """A few lines for one backend."""
    name = result["backend"]
    if result["status"] == "skipped":
        return f"{name:10s} skipped: {result['reason']}"
    n = result["processes"]
    head = f"{name:10s} {'ok' if result['status'] == 'ok' else 'FAILED':6s} {n} process{'es' if n > 1 else ''}"
    if result["times_ms"]:
        head += "  " + "  ".join(f"{c} {ms:.3f} ms" for c, ms in result["times_ms"].items())
    lines = [head]
    if result["never_arrived"]:
        ranks = ", ".join(map(str, result["never_arrived"]))
        lines.append(f"{'':10s} never arrived within {result['timeout_s']:g} s: rank(s) {ranks}")
    lines += [f"{'':10s} {p}" for p in result["problems"]]
    zero = result["ranks"][0] or {}
    routes = [f"rank {r['rank']} {r.get('interface')} {r.get('address')}" for r in result["ranks"] if r]
    if routes:
        at = f"rank 0 at {zero['rendezvous']} on {zero['host']}; " if zero else ""
        lines.append(f"{'':10s} {at}route to it: " + ", ".join(routes))
    transport = zero.get("transport")
    if transport:
        labels = {"gloo_address": "gloo binds"}
        lines.append(f"{'':10s} " + ", ".join(f"{labels.get(k, k)} {v}" for k, v in transport.items()))
    return "\n".join(lines)


def run_from_args(args: argparse.Namespace) -> int:
    """``paraflow check comm``: print each backend's result; 1 when any failed, 2 for bad arguments."""
    names = [n for item in (args.backend or []) for n in item.split(",") if n] or None
    nprocs = 2 if args.nprocs is None else args.nprocs
    timeout = DEFAULT_TIMEOUT if args.wait_timeout is None else args.wait_timeout
    if nprocs < 1 or timeout <= 0:
        print("paraflow check comm: -n and --wait-timeout must be positive.", file=sys.stderr)
        return 2
    if not args.json:
        print(
            f"communication check: up to {nprocs} processes per backend on this host, "
            f"timeout {timeout:g} s, times are medians over 20 calls (slowest rank)",
            flush=True,
        )
    try:
        results = run_checks(names, nprocs, timeout, out=None if args.json else sys.stdout)
    except ParaflowError as exc:
        print(f"paraflow check comm: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(results))
    return 1 if any(r["status"] == "failed" for r in results) else 0
