"""Checkpoints that survive crashes and move between backends.

``save`` is collective: every rank calls it, rank 0 alone writes. The write is atomic: a
temporary file in the target's directory is written, flushed and fsynced, renamed over the
target with ``os.replace``, and the directory is fsynced, so a crash or a full disk part-way
leaves the previous checkpoint whole. ``load`` is collective too: every rank waits at a barrier,
then reads the file itself (so the path must be on a file system every rank sees), mapped to its
own device.

Models are stored unwrapped (``backend.unwrap(model).state_dict()``), so a checkpoint written
under one backend loads under any other; fsdp's sharded checkpoint directories load too, read
whole (`paraflow.training.checkpoint_sharded`). Each rank's RNG states (torch CPU, CUDA,
Python, NumPy) are stored too and restored on load. The CRC-32s ``torch.save`` writes into its zip
archive are checked before the file is loaded (`paraflow.training.checkpoint_reader`).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tempfile
from collections.abc import Mapping, MutableMapping
from typing import IO, Any, Callable, Optional

import torch
from torch import nn

from ..errors import CheckpointError, ConfigurationError
from ..reliability.translation import collective_errors
from .checkpoint_reader import capture_rng_state, read_checkpoint, restore_rng_state
from .checkpoint_sharded import read_sharded_checkpoint
from .object_collectives import allgather_objects

__all__ = [
    "save_checkpoint",
    "load_checkpoint",
    "state_to_save",
    "restore_state",
    "has_state_dict",
    "checkpoint_header",
    "atomic_write",
    "capture_rng_state",
    "restore_rng_state",
    "FORMAT_VERSION",
]

#: The layout's version, in every checkpoint's header.
FORMAT_VERSION = 2


# ------------------------------------------------------------------------- atomic file write
def _fsync_directory(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # some platforms cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str, write: Callable[[IO[bytes]], None]) -> None:
    """Write `path` through `write(file)` so that readers see the old file or the whole new one.

    The bytes go to a temporary file next to `path`, are flushed and fsynced, and the file is
    renamed over `path` (``os.replace``); then the directory is fsynced so the rename survives a
    power loss. On any failure the temporary file is removed and `path` is untouched.
    """
    path = os.path.abspath(path)
    directory, name = os.path.split(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_directory(directory)
    for stale in glob.glob(os.path.join(glob.escape(directory), f".{glob.escape(name)}.*.tmp")):
        with contextlib.suppress(OSError):  # left by a writer that was killed part-way
            os.unlink(stale)


def _free_space(path: str) -> str:
    try:
        free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
    except OSError:
        return ""
    return f" ({free / 2**20:.0f} MiB free there)"


class _WriteErrors:
    """Passes writes to `f`, keeping the OSError a write raised: torch reports a failed write as
    "unexpected pos", hiding the cause (a full disk: ENOSPC)."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f, self.error = f, None

    def write(self, data: Any) -> int:
        try:
            return self._f.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self._f.flush()


def _serialize(payload: Any, f: IO[bytes]) -> None:
    """``torch.save(payload, f)``; a failed write raises its own OSError."""
    writer = _WriteErrors(f)
    try:
        torch.save(payload, writer)
    except Exception as exc:
        if writer.error is not None and writer.error is not exc:
            raise writer.error from exc
        raise


# ------------------------------------------------------------------------- state <-> entries
def has_state_dict(value: Any) -> bool:
    """Whether `value` is saved by its state dict (module, optimizer, scaler, sampler)."""
    return isinstance(value, nn.Module) or (hasattr(value, "state_dict") and hasattr(value, "load_state_dict"))


def checkpoint_header(backend: Any) -> dict:
    """What every checkpoint records about its writer: format version, backend, world size."""
    return {"format": FORMAT_VERSION, "backend": backend.name, "world_size": backend.world_size}


def state_to_save(backend: Any, state: Mapping[str, Any]) -> dict:
    """`state` as a checkpoint stores it: modules unwrapped and by state dict, stateful objects by
    state dict, anything else as it is (what `Backend._state_to_save` does by default)."""
    saved = {}
    for key, value in state.items():
        if isinstance(value, nn.Module):
            saved[key] = backend.unwrap(value).state_dict()
        elif has_state_dict(value):
            saved[key] = value.state_dict()
        else:
            saved[key] = value
    return saved


def restore_state(backend: Any, state: Optional[MutableMapping[str, Any]], saved: Mapping[str, Any], path: str) -> dict:
    """Restore `state` in place from the checkpoint entries `saved`; the entries not restored into
    an object (what `Backend._restore_state` does by default)."""
    rest = dict(saved)
    for key, target in (state or {}).items():
        if key not in saved:
            raise ConfigurationError(f"checkpoint {path} has no entry {key!r}; it has: {', '.join(saved)}.")
        if has_state_dict(target):
            module = backend.unwrap(target) if isinstance(target, nn.Module) else target
            try:
                module.load_state_dict(saved[key])
            except (RuntimeError, KeyError, ValueError) as exc:
                raise ConfigurationError(
                    f"checkpoint entry {key!r} does not fit this {type(target).__name__}: {exc}"
                ) from exc
            del rest[key]
        else:
            state[key] = saved[key]
    return rest


# ------------------------------------------------------------------------- save / load


def _agree(backend: Any, ok: bool) -> list[int]:
    """Ranks (all of them see the same list) where `ok` is False; also a barrier."""
    flags = backend.allgather(torch.tensor([int(ok)], dtype=torch.int64))
    return [r for r, f in enumerate(flags) if not int(f.item())]


def save_checkpoint(backend: Any, path: str, state: Mapping[str, Any]) -> None:
    """Write `state` to `path` from rank 0, atomically; a collective call on every rank.

    Args:
        backend: the initialised backend.
        path: the checkpoint file; its directory is created if needed.
        state: names mapped to objects. Modules are saved unwrapped; anything with
            ``state_dict()`` / ``load_state_dict()`` (optimizer, GradScaler, ShardSampler) by its
            state dict; anything else (epoch, step, tensors, lists) as it is.

    Raises:
        CheckpointError: on every rank, when rank 0 could not write (the previous file at `path`
            is left as it was).
    """
    with collective_errors(backend, f"backend.save of checkpoint {path}"):
        _save(backend, path, state)


def _save(backend: Any, path: str, state: Mapping[str, Any]) -> None:
    rng = allgather_objects(backend, capture_rng_state(backend.device))
    saveable = backend._state_to_save(state)  # on every rank: a sharded backend gathers here
    error: Optional[BaseException] = None
    if backend.is_main:
        payload = {
            "paraflow": checkpoint_header(backend),
            "state": saveable,
            "rng": rng,
        }
        try:
            atomic_write(path, lambda f: _serialize(payload, f))
        except Exception as exc:  # reported on every rank below
            error = exc
    if _agree(backend, error is None):
        cause = f"{error}{_free_space(path)}" if error is not None else "see rank 0 for the cause"
        raise CheckpointError(
            f"rank 0 could not write checkpoint {path}: {cause}; the previous file, if any, is intact."
        ) from error


def load_checkpoint(
    backend: Any, path: str, state: Optional[MutableMapping[str, Any]] = None, restore_rng: bool = True
) -> dict:
    """Read `path` on every rank after a barrier and restore `state` from it; a collective call.

    Args:
        backend: the initialised backend.
        path: a file written by `save_checkpoint` under any backend, or the directory fsdp's
            sharded ``backend.save`` wrote (read whole on each rank, no process group needed).
        state: names mapped to the objects to restore in place (module, optimizer, scaler,
            sampler); for plain values (epoch, step) the mapping's entry is replaced.
            Every name must be in the checkpoint.
        restore_rng: also restore this rank's RNG states (rank ``r`` takes the states rank
            ``r % saved world size`` wrote).

    Returns:
        The saved entries that were not restored into an object: plain values and names not
        in `state` (with `state=None`, everything, state dicts included).

    Raises:
        CheckpointError: the file is missing, unreadable, damaged (its CRC-32 does not match) or
            not a checkpoint on some rank, or its RNG state cannot be restored (all ranks raise).
        ConfigurationError: an entry is missing or does not fit its object.
    """
    with collective_errors(backend, f"backend.load of checkpoint {path}"):
        return _load(backend, path, state, restore_rng)


def _load(backend: Any, path: str, state: Optional[MutableMapping[str, Any]], restore_rng: bool) -> dict:
    backend.barrier()
    checkpoint: Optional[dict] = None
    error: Optional[BaseException] = None
    try:
        if os.path.isdir(path):  # fsdp's sharded checkpoint, read whole
            checkpoint = read_sharded_checkpoint(path, backend.device, backend.rank, restore_rng)
        else:
            checkpoint = read_checkpoint(path, backend.device, backend.rank, restore_rng)
    except Exception as exc:
        error = exc
    failed = _agree(backend, error is None)
    if failed:
        raise CheckpointError(
            f"could not read checkpoint {path} on rank(s) {failed}{': ' + str(error) if error is not None else ''}"
        ) from error
    rest = backend._restore_state(state, checkpoint["state"], path)
    if restore_rng:
        rng = checkpoint["rng"]
        restore_rng_state(rng[backend.rank % len(rng)], backend.device)
    return rest
