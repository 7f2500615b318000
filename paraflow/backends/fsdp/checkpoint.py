"""FSDP's checkpoints: sharded directories, and whole states.

In a sharded checkpoint every rank writes its own shards with torch.distributed.checkpoint
(DCP). It is a directory::

    PATH/current        the name of the committed version, replaced atomically by rank 0
    PATH/<version>/     DCP's files (.metadata, one __<rank>_0.distcp per rank) and paraflow.pt

A save writes a new version next to the committed one; only when every rank has written its
shards and rank 0 the metadata does rank 0 replace ``current`` (``atomic_write``). A crash or a
killed rank before that leaves the previous version current and loadable; the next committed
save removes versions left behind. DCP reshards on load, so any number of ranks reads it.
``paraflow.pt`` (rank 0) holds what is not sharded: every rank's RNG states, plain entries
(epoch, step), small state dicts (scaler, sampler) and which entries DCP holds. Other backends
read it whole (:mod:`paraflow.training.checkpoint_sharded`).

Whole, unsharded model and optimizer states (``export``, full files) are exactly what the other
backends save: ``model.state_dict()`` of the user's module and ``optimizer.state_dict()`` keyed by
parameter position. So a full checkpoint written under fsdp loads under ddp, horovod or single,
and theirs load under fsdp. torch's ``torch.distributed.checkpoint.state_dict`` does the gathering
and sharding; it keys optimizer state by parameter name, which is translated here to and from
positions.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, Optional

import torch
from torch import nn

from ...core.compiling import uncompiled
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
from ...training.checkpoint_sharded import EXTRAS, POINTER, committed_version, optimizer_state_by_position
from ...training.object_collectives import allgather_objects, broadcast_object

__all__ = [
    "ShardedCheckpointer",
    "is_sharded",
    "reshard",
    "owner_of",
    "full_model_state",
    "full_optimizer_state",
    "load_full_model_state",
    "load_full_optimizer_state",
]


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
        sharded, kinds, rest = {}, {}, {}
        for key, value in state.items():
            if isinstance(value, torch.optim.Optimizer) and is_sharded(value) and value.state:
                sharded[key], kinds[key] = self._state_dict(value, state), "optimizer"
            elif isinstance(value, torch.nn.Module) and is_sharded(value):
                sharded[key], kinds[key] = self._state_dict(value, state), "model"
            else:  # a fresh optimizer's state dict holds no tensors: it goes with the rest
                rest.update(state_to_save(self.backend, {key: value}))
        return sharded, kinds, rest

    def _state_dict(self, value: Any, state: Mapping[str, Any]) -> dict:
        """DCP's sharded state dict of a sharded model or optimizer, laid out like this run's shards
        (an optimizer without state gets it created, for DCP to fill)."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        if isinstance(value, torch.nn.Module):
            return get_model_state_dict(value)
        return get_optimizer_state_dict(self.backend._owner(value, state), value)

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
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

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
        targets = {}  # the sharded state dicts DCP loads into, laid out like this run's shards
        for key, value in state.items():
            kind = kinds.get(key)
            if kind is None:
                if key not in saved:
                    raise ConfigurationError(
                        f"checkpoint {path} has no entry {key!r}; it has: {', '.join([*kinds, *saved])}."
                    )
                continue
            wanted = torch.optim.Optimizer if kind == "optimizer" else torch.nn.Module
            if not (isinstance(value, wanted) and is_sharded(value)):
                raise ConfigurationError(
                    f"checkpoint {path} holds a sharded {kind} under {key!r}, but this state has a "
                    f"{type(value).__name__} there that fsdp did not wrap."
                )
            targets[key] = self._state_dict(value, state)
        try:
            dcp.load(targets, checkpoint_id=directory)
            for key, loaded in targets.items():
                if kinds[key] == "model":
                    set_model_state_dict(state[key], loaded)
                else:
                    with keep_tuples(state[key]):
                        set_optimizer_state_dict(b._owner(state[key], state), state[key], loaded)
        except _failures() as exc:
            raise ConfigurationError(f"sharded checkpoint {path} does not fit this state: {_cause(exc)}") from exc
        others = {k: v for k, v in state.items() if k not in kinds}
        rest = restore_state(b, others, saved, path)
        state.update(others)  # plain entries (epoch, step) were replaced in `others`
        rng = extras["rng"]
        restore_rng_state(rng[b.rank % len(rng)], b.device)
        return rest

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


def is_sharded(value: Any) -> bool:
    """Whether `value` is a module fully_shard wrapped, or an optimizer over DTensor parameters.

    A module is asked for its class, not its parameters: between a forward and the next backward
    FSDP may have swapped the unsharded tensors in.
    """
    if isinstance(value, nn.Module):
        from torch.distributed.fsdp import FSDPModule

        return isinstance(uncompiled(value), FSDPModule)
    if isinstance(value, torch.optim.Optimizer):
        from torch.distributed.tensor import DTensor

        return any(isinstance(p, DTensor) for group in value.param_groups for p in group["params"])
    return False


def reshard(values: Any) -> None:
    """Put the sharded parameters back into every fully_shard module among `values`.

    After a forward without backward (evaluation), FSDP leaves the root's parameters gathered
    and registered in place of the shards; saving, loading and mapping optimizer parameters to
    names all need the shards registered.
    """
    from torch.distributed.fsdp import FSDPModule

    for value in values:
        value = uncompiled(value) if isinstance(value, nn.Module) else value
        if isinstance(value, FSDPModule):
            for module in value.modules():
                if isinstance(module, FSDPModule):
                    module.reshard()


def owner_of(optimizer: torch.optim.Optimizer, known: Optional[nn.Module], state: Mapping[str, Any]) -> nn.Module:
    """The sharded model whose parameters `optimizer` steps: the one wrap_optimizer was given,
    else the one sharded module in `state` holding them."""
    if known is not None:
        return known
    ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
    owners = [m for m in state.values() if isinstance(m, nn.Module) and ids <= {id(p) for p in m.parameters()}]
    if len(owners) != 1:
        raise ConfigurationError(
            "cannot tell which model this optimizer steps; pass it through backend.wrap_optimizer(optimizer, "
            "model), or put that model in the same checkpoint state."
        )
    return owners[0]


def _options(**kwargs: Any):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(**kwargs)


def full_model_state(model: nn.Module) -> dict:
    """The whole ``state_dict`` on rank 0, on the CPU (other ranks get an empty one); collective."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options(full_state_dict=True, cpu_offload=True))


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The whole ``optimizer.state_dict()`` (keyed by position) on rank 0; collective.

    A fresh optimizer has no tensors to gather and is returned as it is: torch's
    get_optimizer_state_dict would first create its state with a zero-gradient step, which Adam
    counts as a step, changing the rest of the run.
    """
    if not optimizer.state:
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    by_name = get_optimizer_state_dict(model, optimizer, options=_options(full_state_dict=True, cpu_offload=True))
    return optimizer_state_by_position(by_name) if by_name else {}


def load_full_model_state(model: nn.Module, state: Mapping[str, Any]) -> None:
    """Shard a whole ``state_dict`` (the same on every rank) into `model`; collective."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(model, dict(state), options=_options(full_state_dict=True))


def load_full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: Mapping[str, Any]) -> None:
    """Shard a whole ``optimizer.state_dict()`` (the same on every rank) into `optimizer`; collective."""
    if not state.get("state"):  # nothing to shard: hyperparameters only
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    # each parameter's name in `model`, in the positions optimizer.state_dict() uses
    name_of = {id(p): name for name, p in model.named_parameters()}
    names = [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]
    try:
        by_name: MutableMapping[str, Any] = {
            "state": {names[int(i)]: value for i, value in state["state"].items()},
            "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in state["param_groups"]],
        }
    except (IndexError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"its parameter positions do not match this optimizer's {len(names)} parameters") from exc
    with keep_tuples(optimizer):
        set_optimizer_state_dict(model, optimizer, by_name, options=_options(full_state_dict=True))


@contextlib.contextmanager
def keep_tuples(optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """Give hyperparameters back their tuple type after torch's state-dict loading made them lists.

    torch.distributed.checkpoint flattens and rebuilds state dicts, which turns Adam's ``betas``
    into a list; the optimizer works either way, but its state dict would no longer equal the
    one other backends save.
    """
    before = [{k: v for k, v in group.items() if isinstance(v, tuple)} for group in optimizer.param_groups]
    yield
    for group, tuples in zip(optimizer.param_groups, before):
        for key in tuples:
            if isinstance(group.get(key), list):
                group[key] = tuple(group[key])
