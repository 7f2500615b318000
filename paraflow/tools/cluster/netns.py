"""Thin wrappers over `ip` and `tc`: network namespaces, links, bandwidth shaping, their processes.

Every call runs the real tool and turns a failure into :class:`ClusterError` with the command and
its message, so a half-built cluster is never mistaken for a working one.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from typing import Optional

from ...errors import ParaflowError

__all__ = [
    "ClusterError",
    "support_problem",
    "run",
    "namespaces",
    "namespace_pids",
    "kill_namespace_processes",
    "parse_rate",
    "format_rate",
    "shape",
]


class ClusterError(ParaflowError, RuntimeError):
    """The emulated cluster could not be built, used or taken down."""


def support_problem() -> Optional[str]:
    """None when this machine can build an emulated cluster, else why not (for skips and errors)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root (network namespaces): run as root or with sudo"
    tools = (("ip", "iproute2"), ("tc", "iproute2"), ("sysctl", "procps"), ("unshare", "util-linux"))
    for tool, package in (*tools, ("hostname", "hostname")):
        if shutil.which(tool) is None:
            return f"`{tool}` is missing: apt-get install {package}"
    probe = f"pfprobe{os.getpid()}"
    try:
        run(["ip", "netns", "add", probe])
    except ClusterError as exc:
        return f"`ip netns add` does not work here ({exc})"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def run(argv: list, namespace: Optional[str] = None, check: bool = True) -> str:
    """Run `argv` (inside `namespace` when given, through `ip netns exec`); return its stdout."""
    full = ["ip", "netns", "exec", namespace, *argv] if namespace else list(argv)
    result = subprocess.run([str(a) for a in full], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise ClusterError(f"`{' '.join(map(str, full))}` failed: {result.stderr.strip() or result.returncode}")
    return result.stdout


def namespaces() -> list[str]:
    """Names of every network namespace `ip netns` knows."""
    return [line.split()[0] for line in run(["ip", "netns", "list"]).splitlines() if line.strip()]


def namespace_pids(name: str) -> list[int]:
    """Processes whose network namespace is `name`."""
    return [int(p) for p in run(["ip", "netns", "pids", name], check=False).split()]


def kill_namespace_processes(name: str, wait_s: float = 10.0) -> list[int]:
    """SIGKILL every process in namespace `name` until none is left; return the pids killed."""
    killed: list[int] = []
    deadline = time.monotonic() + wait_s
    while True:
        pids = namespace_pids(name)
        if not pids:
            return killed
        if time.monotonic() > deadline:
            raise ClusterError(f"processes {pids} in namespace {name} survived SIGKILL for {wait_s:g} s")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


_RATE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)bit", re.IGNORECASE)
_SCALE = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_rate(text: str) -> int:
    """Bits per second from tc's notation: ``100mbit``, ``1gbit``, ``10gbit`` (powers of 1000)."""
    match = _RATE.fullmatch(str(text).strip())
    if not match or float(match.group(1)) <= 0:
        raise ClusterError(
            f"bandwidth {text!r} is not a rate tc understands in bits per second; "
            "write it like 100mbit, 1gbit or 10gbit (paraflow cluster up --bandwidth 1gbit)."
        )
    return int(float(match.group(1)) * _SCALE[match.group(2).lower()])


def format_rate(bits_per_s: int) -> str:
    """The shortest tc notation for a rate: 1000000000 -> ``1gbit``."""
    for unit, scale in (("t", 10**12), ("g", 10**9), ("m", 10**6), ("k", 10**3)):
        if bits_per_s % scale == 0:
            return f"{bits_per_s // scale}{unit}bit"
    return f"{bits_per_s}bit"


def shape(namespace: str, device: str, bits_per_s: Optional[int]) -> None:
    """Limit `device`'s egress to `bits_per_s` with a token bucket (tbf); None removes the limit.

    The bucket holds 2 ms of traffic (at least 256 KiB, so segmentation offload's 64 KiB packets
    pass whole) and queues up to 50 ms before dropping, like a switch port's buffer.
    """
    if bits_per_s is None:
        run(["tc", "qdisc", "del", "dev", device, "root"], namespace, check=False)
        return
    burst = max(256 * 1024, bits_per_s // 8 // 500)
    run(
        ["tc", "qdisc", "replace", "dev", device, "root", "tbf"]
        + ["rate", f"{bits_per_s}bit", "burst", str(burst), "latency", "50ms"],
        namespace,
    )
