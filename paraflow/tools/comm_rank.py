"""What each process of ``paraflow check comm`` does: arrive, start the backend, check four collectives.

First every rank reports at rank 0's address (MASTER_ADDR:MASTER_PORT) through a torch TCPStore
that rank 0 serves, so that a rank which cannot get there is named, by rank 0, after the timeout
(a process-group start would only say "1 of 2 clients joined"). Rank 0 then hands out a fresh
port, the backend starts there, and allreduce, broadcast, allgather and barrier run with values
whose results are known, timed over repeated calls. Nothing is raised: the report says what failed.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import statistics
import struct
import time
from typing import Any, Optional

__all__ = ["check_rank", "COLLECTIVES"]

COLLECTIVES = ("allreduce", "broadcast", "allgather", "barrier")
_REPEAT = 20


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
        report["error"] = f"could not {what} at {addr}:{port} within {timeout:g} s: {_line(exc)}"
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
        report["error"] = f"{type(exc).__name__} during {report['stage']}: {_line(exc)}"
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
    ranks = f"rank {missing[0]}" if len(missing) == 1 else f"ranks {', '.join(map(str, missing))}"
    go = f"abort:{ranks} never arrived" if missing else str(fresh_port())
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
    try:
        import fcntl
    except ImportError:
        return None
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))  # SIOCGIFADDR
            except OSError:
                continue
        if socket.inet_ntoa(packed[20:24]) == ip:
            return name
    return None


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
