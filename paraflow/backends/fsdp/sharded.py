"""Sharded checkpoints: every rank writes its own shards with torch.distributed.checkpoint (DCP).

A checkpoint is a directory::

    PATH/current        the name of the committed version, replaced atomically by rank 0
    PATH/<version>/     DCP's files (.metadata, one __<rank>_0.distcp per rank) and paraflow.pt

A save writes a new version next to the committed one; only when every rank has written its
shards and rank 0 the metadata does rank 0 replace ``current`` (``atomic_write``). A crash or a
killed rank before that leaves the previous version current and loadable; the next committed
save removes versions left behind. DCP reshards on load, so any number of ranks reads it.
``paraflow.pt`` (rank 0) holds what is not sharded: every rank's RNG states, plain entries
(epoch, step), small state dicts (scaler, sampler) and which entries DCP holds. Other backends
read it whole (:mod:`paraflow.training.checkpoint_sharded`).
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import uuid
from collections.abc import Mapping, MutableMapping
from typing import Any, Optional

import torch

from ...errors import CheckpointError, ConfigurationError
from ...reliability.stall import stall_facts
from ...training.checkpoint import (
    _agree,
    atomic_write,
    capture_rng_state,
    checkpoint_header,
    restore_rng_state,
    restore_state,
    state_to_save,
)
from ...training.checkpoint_sharded import EXTRAS, POINTER, committed_version
from ...training.object_collectives import allgather_objects, broadcast_object
from .full_state import is_sharded, keep_tuples

__all__ = ["ShardedCheckpointer", "POINTER", "EXTRAS", "committed_version"]


def _write_extras(directory: str, extras: dict) -> Optional[BaseException]:
    """Rank 0: create the version's directory and write what DCP does not hold; the error, if any."""
    try:
        os.makedirs(directory, exist_ok=True)
        atomic_write(os.path.join(directory, EXTRAS), lambda f: torch.save(extras, f))
    except Exception as exc:
        return exc
    return None


def _commit(path: str, version: str) -> None:
    """Rank 0: make `version` the current one, then remove every other version in `path`."""
    atomic_write(os.path.join(path, POINTER), lambda f: f.write(version.encode()))
    for name in os.listdir(path):
        full = os.path.join(path, name)
        if name != version and os.path.isdir(full):
            shutil.rmtree(full, ignore_errors=True)


class ShardedCheckpointer:
    """Sharded save and load for one FSDP backend; holds its pending asynchronous save."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self._pending: Optional[concurrent.futures.Future] = None
        self._group = None

    # ----------------------------------------------------------------- entries
    def _split(self, state: Mapping[str, Any]) -> tuple:
        """(entries DCP writes, kind of each of those, everything else as a full checkpoint stores it)."""
        b = self.backend
        sharded, kinds, rest = {}, {}, {}
        for key, value in state.items():
            if isinstance(value, torch.optim.Optimizer) and is_sharded(value) and value.state:
                model = b._owner(value, state)
                from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

                sharded[key], kinds[key] = get_optimizer_state_dict(model, value), "optimizer"
            elif isinstance(value, torch.nn.Module) and is_sharded(value):
                from torch.distributed.checkpoint.state_dict import get_model_state_dict

                sharded[key], kinds[key] = get_model_state_dict(value), "model"
            else:  # a fresh optimizer's state dict holds no tensors: it goes with the rest
                rest.update(state_to_save(b, {key: value}))
        return sharded, kinds, rest

    # ----------------------------------------------------------------- save
    def save(self, path: str, state: Mapping[str, Any], asynchronous: bool) -> None:
        """Write `state` to a new version under `path` and commit it; a collective call."""
        import torch.distributed.checkpoint as dcp

        b = self.backend
        self.wait()
        if os.path.isfile(path):
            raise CheckpointError(
                f"{path} is a file (a full checkpoint); fsdp's save writes a directory of shards there. "
                "Pick another path, or write a full file with backend.export(path, state)."
            )
        version = broadcast_object(b, f"v-{uuid.uuid4().hex[:12]}")
        directory = os.path.join(path, version)
        rng = allgather_objects(b, capture_rng_state(b.device))
        sharded, kinds, rest = self._split(state)
        extras = {"paraflow": checkpoint_header(b), "kinds": kinds, "state": rest, "rng": rng}
        self._agree(_write_extras(directory, extras) if b.is_main else None, f"rank 0 could not write {directory}")
        if asynchronous:
            if self._group is None:  # checkpoint traffic apart from training's collectives
                import torch.distributed as dist

                self._group = dist.new_group(backend="gloo")
            response = dcp.async_save(sharded, checkpoint_id=directory, process_group=self._group)
            self._pending = self._then_commit(getattr(response, "upload_completion", response), path, version)
            return
        try:
            dcp.save(sharded, checkpoint_id=directory)
        except _failures() as exc:  # DCP gathers every rank's failure, so all ranks raise together
            raise CheckpointError(
                f"could not write sharded checkpoint {directory}: {_cause(exc)}{_PREVIOUS}.{stall_facts(b)}"
            ) from exc
        error: Optional[BaseException] = None
        if b.is_main:
            try:
                _commit(path, version)
            except Exception as exc:
                error = exc
        self._agree(error, f"rank 0 could not commit {directory}")

    def _then_commit(self, upload: concurrent.futures.Future, path: str, version: str) -> concurrent.futures.Future:
        """A future done once `upload` is and, on rank 0, the version is committed."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        is_main = self.backend.is_main

        def finish(future: concurrent.futures.Future) -> None:
            try:
                future.result()
                if is_main:  # DCP's coordinator finishes after every rank has written
                    _commit(path, version)
                done.set_result(None)
            except BaseException as exc:
                done.set_exception(exc)

        upload.add_done_callback(finish)
        return done

    def wait(self) -> None:
        """Wait for the asynchronous save in flight, if any; raise CheckpointError if it failed."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            pending.result()
        except _failures() as exc:
            raise CheckpointError(f"the asynchronous sharded save failed: {_cause(exc)}{_PREVIOUS}") from exc

    def close(self) -> None:
        """At shutdown: finish the save in flight; the next session makes its own checkpoint group."""
        try:
            self.wait()
        finally:
            self._group = None

    # ----------------------------------------------------------------- load
    def load(self, path: str, state: Optional[MutableMapping[str, Any]]) -> dict:
        """Restore `state` in place from `path`'s committed version; a collective call."""
        import torch.distributed.checkpoint as dcp

        b = self.backend
        self.wait()
        b.barrier()
        extras: Optional[dict] = None
        error: Optional[BaseException] = None
        try:
            directory = committed_version(path)
            extras = torch.load(os.path.join(directory, EXTRAS), map_location=b.device, weights_only=True)
        except Exception as exc:
            error = exc
        self._agree(error, f"could not read sharded checkpoint {path}", everywhere=True)
        kinds, saved = extras["kinds"], extras["state"]
        state = state if state is not None else {}
        for key in state:
            if key not in kinds and key not in saved:
                raise ConfigurationError(
                    f"checkpoint {path} has no entry {key!r}; it has: {', '.join([*kinds, *saved])}."
                )
        targets = self._targets(state, kinds, path)
        try:
            dcp.load(targets, checkpoint_id=directory)
            self._restore_sharded(state, targets, kinds)
        except _failures() as exc:
            raise ConfigurationError(f"sharded checkpoint {path} does not fit this state: {_cause(exc)}") from exc
        others = {k: v for k, v in state.items() if k not in kinds}
        rest = restore_state(b, others, saved, path)
        state.update(others)  # plain entries (epoch, step) were replaced in `others`
        rng = extras["rng"]
        restore_rng_state(rng[b.rank % len(rng)], b.device)
        return rest

    def _targets(self, state: Mapping[str, Any], kinds: Mapping[str, str], path: str) -> dict:
        """The sharded state dicts DCP loads into, laid out like this run's shards."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        targets = {}
        for key, kind in kinds.items():
            if key not in state:
                continue
            value = state[key]
            wanted = torch.optim.Optimizer if kind == "optimizer" else torch.nn.Module
            if not (isinstance(value, wanted) and is_sharded(value)):
                raise ConfigurationError(
                    f"checkpoint {path} holds a sharded {kind} under {key!r}, but this state has a "
                    f"{type(value).__name__} there that fsdp did not wrap."
                )
            if kind == "model":
                targets[key] = get_model_state_dict(value)
            else:  # creates the optimizer's state if it has none, for DCP to fill
                targets[key] = get_optimizer_state_dict(self.backend._owner(value, state), value)
        return targets

    def _restore_sharded(self, state: Mapping[str, Any], targets: Mapping[str, Any], kinds: Mapping[str, str]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        for key, loaded in targets.items():
            if kinds[key] == "model":
                set_model_state_dict(state[key], loaded)
            else:
                with keep_tuples(state[key]):
                    set_optimizer_state_dict(self.backend._owner(state[key], state), state[key], loaded)

    # ----------------------------------------------------------------- helpers
    def _agree(self, error: Optional[BaseException], what: str, everywhere: bool = False) -> None:
        """Raise CheckpointError on every rank if `error` happened on any."""
        failed = _agree(self.backend, error is None)
        if failed:
            where = f" on rank(s) {failed}" if everywhere else ""
            cause = f": {error}" if error is not None else "; see that rank's error"
            raise CheckpointError(f"{what}{where}{cause}{_PREVIOUS}") from error


_PREVIOUS = "; the previously committed checkpoint, if any, is intact"


def _failures() -> tuple:
    """What a DCP call raises when it fails: its CheckpointException is a BaseException."""
    from torch.distributed.checkpoint.api import CheckpointException

    return (Exception, CheckpointException)


def _cause(exc: BaseException) -> str:
    """One line per failed rank for DCP's CheckpointException (whose text is every traceback)."""
    failures = getattr(exc, "failures", None)
    if not isinstance(failures, dict):
        return str(exc)
    return "; ".join(f"rank {rank}: {type(e).__name__}: {e}" for rank, (e, _) in sorted(failures.items()))
