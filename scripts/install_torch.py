"""Install torch into the environment this Python runs in, deliberately, and say in one line which and why.

Run by scripts/install.sh as ``VENV/bin/python scripts/install_torch.py``; standard library only (torch
is not there yet). The choice, first match:

1. a torch already in the environment is kept;
2. ``PARAFLOW_TORCH_SPEC``, what pip installs: a requirement (``torch==2.13.0``), a wheel file
   (``/path/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl``), or a requirement followed by
   pip options (``torch==2.13.0+cpu --index-url https://download.pytorch.org/whl/cpu``);
3. where an NVIDIA GPU is present (``nvidia-smi`` works, or ``/dev/nvidia*`` exists): PyPI's CUDA build;
4. otherwise the CPU build, ``torch==VERSION+cpu``: from pip's own sources (a site mirror, find-links),
   else from torch's CPU index; where neither serves it, PyPI's CUDA build, said so in one line.
"""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from typing import Callable, Optional

TORCH_VERSION = "2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
_DESCRIBE = (
    "import torch; c = torch.version.cuda; print(torch.__version__, '(CUDA %s build)' % c if c else '(CPU build)')"
)


@dataclass(frozen=True)
class Attempt:
    """One pip install: its arguments and why this one."""

    args: tuple[str, ...]
    reason: str


def gpu_present(
    which: Callable[[str], Optional[str]] = shutil.which,
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
    devices: Callable[[str], list[str]] = glob.glob,
) -> Optional[str]:
    """What shows an NVIDIA GPU here (``nvidia-smi`` working, or a ``/dev/nvidia*`` node), else None."""
    smi = which("nvidia-smi")
    if smi:
        try:
            if run([smi, "-L"], capture_output=True, text=True, timeout=30).returncode == 0:
                return "nvidia-smi lists a GPU"
        except (OSError, subprocess.TimeoutExpired):
            pass
    nodes = sorted(devices("/dev/nvidia*"))
    return f"{nodes[0]} exists" if nodes else None


def cpu_index_reachable(url: str = CPU_INDEX, timeout: float = 10) -> bool:
    """True when torch's CPU wheel index answers (pip would otherwise retry an unreachable host for minutes)."""
    try:
        with urllib.request.urlopen(f"{url}/torch/", timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def plan(spec: Optional[str], gpu: Optional[str], cpu_index: bool, version: str = TORCH_VERSION) -> list[Attempt]:
    """The pip installs to try in order until one succeeds (the torch already present is handled first)."""
    if spec:
        return [Attempt(tuple(shlex.split(spec)), f"PARAFLOW_TORCH_SPEC={spec}")]
    if gpu:
        return [Attempt((f"torch=={version}",), f"{gpu}, so PyPI's CUDA build")]
    attempts = [Attempt((f"torch=={version}+cpu",), "no GPU here, so the CPU build, from pip's configured sources")]
    if cpu_index:
        attempts.append(
            Attempt(
                (f"torch=={version}+cpu", "--extra-index-url", CPU_INDEX),
                f"no GPU here, so the CPU build, from {CPU_INDEX}",
            )
        )
    attempts.append(
        Attempt(
            (f"torch=={version}",),
            f"no GPU here, but only the CUDA build can be had (no torch {version}+cpu in pip's sources"
            + ("" if cpu_index else f", {CPU_INDEX} unreachable")
            + "), so PyPI's, several GB; for the CPU build set PARAFLOW_TORCH_SPEC to a "
            f"torch-{version}+cpu wheel file or to 'torch=={version}+cpu --index-url {CPU_INDEX}'",
        )
    )
    return attempts


def describe(python: str = sys.executable) -> Optional[str]:
    """``2.13.0+cpu (CPU build)`` / ``2.13.0+cu130 (CUDA 13.0 build)`` for `python`'s torch; None without one."""
    done = subprocess.run([python, "-c", _DESCRIBE], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def install(python: str = sys.executable, spec: Optional[str] = None) -> int:
    """Keep or install torch for `python` as the module docstring says; print one line saying which and why."""
    present = describe(python)
    if present:
        hint = "; PARAFLOW_TORCH_SPEC chooses for a new environment" if spec else ""
        print(f"torch {present}: already in this environment, kept{hint}")
        return 0
    errors = []
    for attempt in plan(spec, gpu_present(), cpu_index_reachable()):
        command = f"pip install {' '.join(attempt.args)}"
        done = subprocess.run([python, "-m", "pip", "install", "-q", *attempt.args], capture_output=True, text=True)
        if done.returncode == 0:
            print(f"torch {describe(python)}: {attempt.reason}")
            return 0
        said = (done.stderr.strip() or done.stdout.strip()).splitlines() or ["no output"]
        print(f"`{command}` failed: {said[-1][:200]}", flush=True)
        errors.append(f"`{command}`: {' '.join(said)[-400:]}")
    print("error: torch could not be installed:\n  " + "\n  ".join(errors), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(install(sys.executable, os.environ.get("PARAFLOW_TORCH_SPEC") or None))
