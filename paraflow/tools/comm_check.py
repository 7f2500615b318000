"""``paraflow check comm``: does communication actually work here? A live test of every backend.

For each backend that can run on this machine, N fresh processes (``paraflow.launch``'s workers)
meet at rank 0's address, start the backend and run allreduce, broadcast, allgather and barrier
with known values. Per backend it prints ok or the failure, the median time per call (slowest
rank), the interface and addresses used, and the ranks that never arrived within the timeout. The
exit status is 1 when any backend failed.

Each rank (:func:`check_rank`) first reports at rank 0's address (MASTER_ADDR:MASTER_PORT) through
a torch TCPStore that rank 0 serves, so that a rank which cannot get there is named, by rank 0,
after the timeout (a process-group start would only say "1 of 2 clients joined"). Rank 0 then
hands out a fresh port, the backend starts there, and the four collectives run with values whose
results are known, timed over repeated calls. Nothing is raised on a rank: its report says what
failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import time
from typing import Any, Optional, TextIO

from ..environment.rendezvous import interface_address
from ..errors import LauncherError, ParaflowError
from ..reliability.activity import ranks_text
from ..reliability.translation import error_line
from .flags import renamed
from .spawn import run_workers

__all__ = ["add_arguments", "run_checks", "run_from_args", "render", "check_rank", "COLLECTIVES"]

COLLECTIVES = ("allreduce", "broadcast", "allgather", "barrier")
DEFAULT_TIMEOUT = 30.0
_REPEAT = 20
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
    renamed(parser, "--timeout", use="--wait-timeout")
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


# ---------------------------------------------------------------- one rank
def check_rank(backend: str, timeout: float) -> dict:
    """Run the check on this rank; returns its report (never raises)."""
    from ..environment.launchers import detect_environment, free_port

    env = detect_environment()
    addr, port = env.master_addr or "127.0.0.1", env.master_port
    report: dict[str, Any] = {"rank": env.rank, "host": socket.gethostname(), "stage": "arrival", "error": None}
    report["rendezvous"] = f"{addr}:{port}"
    report.update(route_to(addr))
    start = time.monotonic()
    try:
        store, missing, go = _arrive(env.rank, env.world_size, addr, port, timeout, free_port)
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        what = "serve the rendezvous" if env.rank == 0 else "reach rank 0"
        report["error"] = f"could not {what} at {addr}:{port} within {timeout:g} s: {error_line(exc, 300)}"
        return report
    report["arrival_s"] = round(time.monotonic() - start, 3)
    if missing:
        report["missing"] = missing
        report["error"] = f"waited {timeout:g} s at {addr}:{port}; {go.partition(':')[2]}"
        return report
    if go.startswith("abort"):
        report["error"] = f"rank 0 gave up: {go.partition(':')[2]}"
        return report
    os.environ["MASTER_PORT"] = go  # a fresh port for the backend's own rendezvous
    report["stage"] = "start"
    try:
        import paraflow

        start = time.monotonic()
        instance = paraflow.init(backend, timeout=timeout)
        report["start_s"] = round(time.monotonic() - start, 3)
        report["transport"] = _transport(instance)
        report["times_ms"], report["wrong"] = {}, []
        for name in COLLECTIVES:
            report["stage"] = name
            ok, ms = _time_collective(instance, name)
            report["times_ms"][name] = ms
            if not ok:
                report["wrong"].append(name)
        report["stage"] = "done"
        instance.shutdown()
    except Exception as exc:  # noqa: BLE001
        report["error"] = f"{type(exc).__name__} during {report['stage']}: {error_line(exc, 300)}"
    return report


def _arrive(rank: int, world: int, addr: str, port: int, timeout: float, fresh_port) -> tuple:
    """Meet at rank 0's store: (store, ranks that never arrived, "go": the backend's port or "abort:why").

    Rank 0 keeps the store until every rank that arrived has read "go".
    """
    import torch.distributed as dist

    store = dist.TCPStore(
        addr, port, world, rank == 0, timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False
    )
    store.set(f"arrived/{rank}", json.dumps(route_to(addr)))
    if rank != 0:
        store.wait(["go"])
        go = store.get("go").decode()
        store.set(f"read/{rank}", "1")
        return store, [], go
    deadline = time.monotonic() + timeout
    missing = list(range(world))
    while True:
        missing = [r for r in missing if not store.check([f"arrived/{r}"])]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    go = f"abort:{ranks_text(missing)} never arrived" if missing else str(fresh_port())
    store.set("go", go)
    arrived = [f"read/{r}" for r in range(1, world) if r not in missing]
    if arrived:
        try:
            store.wait(arrived, datetime.timedelta(seconds=min(timeout, 10)))
        except RuntimeError:  # a rank that left after arriving; its own report says why
            pass
    return store, missing, go


def _time_collective(backend, name: str) -> tuple[bool, float]:
    """(right result, median milliseconds per call) for one collective with known values."""
    import torch

    n, r = backend.world_size, backend.rank
    mine = torch.full((4,), float(r + 1), device=backend.device)
    calls = {
        "allreduce": (lambda: backend.allreduce(mine, op="sum"), lambda out: bool((out == n * (n + 1) / 2).all())),
        "broadcast": (lambda: backend.broadcast(mine, src=0), lambda out: bool((out == 1).all())),
        "allgather": (
            lambda: backend.allgather(mine),
            lambda out: len(out) == n and all(bool((t == i + 1).all()) for i, t in enumerate(out)),
        ),
        "barrier": (backend.barrier, lambda out: True),
    }
    call, right = calls[name]
    ok = right(call())  # the first call also warms up
    times = []
    for _ in range(_REPEAT):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return ok, round(statistics.median(times) * 1e3, 3)


def _transport(backend) -> dict:
    """What moves this rank's tensors, and through which interface where the library says so."""
    info: dict[str, Any] = {"transport": backend.transport}
    controller = getattr(backend, "controller", None)
    if controller:
        info["controller"] = controller
    for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "HOROVOD_GLOO_IFACE", "HOROVOD_GLOO_RENDEZVOUS_ADDR"):
        if os.environ.get(key):
            info[key] = os.environ[key]
    if info["transport"] == "gloo" and not controller and not os.environ.get("GLOO_SOCKET_IFNAME"):
        # torch's gloo binds to the address its host name resolves to
        try:
            ip = socket.gethostbyname(socket.gethostname())
            info["gloo_address"] = f"{ip} ({interface_of(ip)})"
        except OSError as exc:
            info["gloo_address"] = f"unresolved host name: {exc}"
    return info


def route_to(peer: str) -> dict:
    """This host's source address and interface towards `peer` (a UDP connect sends nothing)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(peer), 9))
            ip = s.getsockname()[0]
    except OSError as exc:
        return {"address": None, "interface": f"no route to {peer}: {exc}"}
    return {"address": ip, "interface": interface_of(ip)}


def interface_of(ip: str) -> Optional[str]:
    """The name of the network interface holding IPv4 address `ip` (Linux), else None."""
    for _, name in socket.if_nameindex():
        try:
            if interface_address(name) == ip:
                return name
        except (LauncherError, ImportError):  # no IPv4 address there; no fcntl off Linux
            continue
    return None
