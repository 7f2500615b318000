"""Reading one checkpoint file on one rank: the zip archive's CRC-32s first, then torch.load, with
errors that say what is wrong with the file (damaged, truncated, not a checkpoint, an RNG entry
that cannot be restored) instead of what torch or pickle happened to raise; and the RNG states a
checkpoint holds, captured and restored.

``torch.save`` writes a zip archive holding a CRC-32 of every entry, tensor data included, but
``torch.load`` does not check them: a byte flipped inside a tensor loads as a silently different
weight. Python's :mod:`zipfile` checks them (``ZipFile.testzip``), reading the file once before
``torch.load`` reads the same open file.
"""

from __future__ import annotations

import random
import zipfile
from collections.abc import Mapping
from typing import Any, Optional

import torch

__all__ = ["UnreadableCheckpoint", "read_checkpoint", "check_rng_states", "capture_rng_state", "restore_rng_state"]

_ZIP_SIGNATURE = b"PK\x03\x04"


class UnreadableCheckpoint(ValueError):
    """The file exists but is not a whole checkpoint; the message says why."""


def read_checkpoint(path: str, device: torch.device, rank: int, check_rng: bool) -> dict:
    """The checkpoint at `path`, its CRC-32s checked, loaded onto `device`.

    Args:
        path: the file.
        device: where tensors go (``map_location``).
        rank: this process's rank, whose saved RNG state is checked.
        check_rng: whether to check that this rank's saved RNG state can be restored.

    Raises:
        OSError: the file cannot be opened.
        UnreadableCheckpoint: it is damaged, truncated, or not a checkpoint.
    """
    with open(path, "rb") as f:
        try:
            with zipfile.ZipFile(f) as archive:
                damaged = archive.testzip()
        except Exception as exc:  # noqa: BLE001 - described below, chained
            raise UnreadableCheckpoint(_describe(f, exc)) from exc
        if damaged is not None:
            raise UnreadableCheckpoint(
                f"it is damaged: the CRC-32 of its entry {damaged} does not match the one stored when it was "
                "written, so bytes changed after the write (storage, copy or transfer); nothing was loaded. Use "
                "another copy of it, or an earlier checkpoint"
            )
        f.seek(0)
        try:
            checkpoint = torch.load(f, map_location=device, weights_only=True)
        except Exception as exc:  # noqa: BLE001 - described below, chained
            raise UnreadableCheckpoint(_describe(f, exc)) from exc
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("paraflow"), dict):
        raise UnreadableCheckpoint("it is not a paraflow checkpoint (written by something other than backend.save)")
    if check_rng:
        check_rng_states(checkpoint.get("rng"), rank)
    return checkpoint


def check_rng_states(states: Optional[list], rank: int) -> None:
    """Raise UnreadableCheckpoint unless rank `rank` can restore its RNG state from the saved `states`
    (rank ``r`` takes the one rank ``r % len(states)`` wrote); nothing changes in this process."""
    if not states:
        raise UnreadableCheckpoint("it holds no RNG states")
    source = rank % len(states)
    try:
        restore_rng_state(states[source], torch.device("cpu"), scratch=True)
    except Exception as exc:  # noqa: BLE001 - OverflowError, ValueError, TypeError, KeyError, ...
        raise UnreadableCheckpoint(
            f"the RNG state saved by rank {source} cannot be restored ({type(exc).__name__}: {exc}): the entry is "
            "damaged or was not written by backend.save. Load with paraflow.load_checkpoint(backend, path, state, "
            "restore_rng=False) to keep this process's RNG states"
        ) from exc


def _numpy():
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def capture_rng_state(device: torch.device) -> dict:
    """This process's RNG states: torch CPU, the CUDA device's (if `device` is one), Python, NumPy."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    np = _numpy()
    if np is not None:
        name, keys, pos, has_gauss, gauss = np.random.get_state()
        state["numpy"] = (str(name), torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss))
    return state


def restore_rng_state(state: Mapping[str, Any], device: torch.device, scratch: bool = False) -> None:
    """Restore what `capture_rng_state` returned; CUDA state only onto a CUDA device.

    With `scratch`, each part is restored onto a new generator instead (the CUDA state is left
    out): it raises where the real restore would, and changes nothing in this process.
    """
    (torch.Generator() if scratch else torch.default_generator).set_state(state["torch"].cpu())
    py = state["python"]
    (random.Random() if scratch else random).setstate((py[0], tuple(py[1]), py[2]))
    if "cuda" in state and device.type == "cuda" and not scratch:
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)
    np = _numpy()
    if "numpy" in state and np is not None:
        name, keys, pos, has_gauss, gauss = state["numpy"]
        numpy_state = (name, keys.cpu().numpy().astype(np.uint32), pos, has_gauss, gauss)
        (np.random.RandomState() if scratch else np.random).set_state(numpy_state)


def _describe(f, exc: BaseException) -> str:
    size = f.seek(0, 2)
    f.seek(0)
    head = f.read(4)
    if size == 0:
        return "the file is empty"
    if head != _ZIP_SIGNATURE:
        return (
            f"it is not a checkpoint: backend.save writes a zip archive (torch.save's format), and this file of "
            f"{size} bytes starts with {head!r}"
        )
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"it is truncated or damaged ({size} bytes; {type(exc).__name__}{': ' + detail if detail else ''})"
