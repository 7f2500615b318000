"""The elastic state: what a job keeps across a lost or added worker, and its commits."""

from __future__ import annotations

import copy
import inspect
import os
import queue
from collections.abc import Iterable
from typing import Any, Callable, Optional

import torch
from torch import nn

from ..core.current import current
from ..errors import ConfigurationError
from ..training.checkpoint import has_state_dict
from ..training.object_collectives import broadcast_object
from .sampler import ElasticSampler

__all__ = ["State", "TorchState", "HostsUpdated"]

_OWN = frozenset({"backend", "checkpoint", "save_every", "commits", "recoveries"})


class HostsUpdated(Exception):
    """Raised on every rank by `State.commit` when the launcher added or removed hosts: the run
    wrapper re-enters the training function at the new size, from the state as it is (no rollback)."""

    def __init__(self, skip_sync: bool) -> None:
        super().__init__("hosts were added or removed")
        #: Only removed: no new worker needs the state, so it is not sent again.
        self.skip_sync = skip_sync


class State:
    """The model, the optimizer, the samplers and the user's own fields, committed and restored
    together (Horovod's ``TorchState``, for every backend).

    Every keyword becomes an attribute (``state.epoch``, ``state.sampler``); objects with
    ``state_dict``/``load_state_dict`` (optimizer, sampler, scaler, scheduler) are kept by state
    dict, modules unwrapped, anything else (epoch, step, picklable values) as it is.

    `commit` marks a point the job can go back to. Under horovodrun's elastic mode it is a
    copy in memory, and the survivors of a lost worker roll back to it in process; under
    torchrun's elastic agent (and any other launcher) every `save_every`-th commit writes
    `checkpoint` (``backend.save``: atomic, sharded under fsdp), which a restarted worker
    restores. `paraflow.elastic.run` does the restoring.

    Args:
        model: the wrapped model.
        optimizer: the wrapped optimizer.
        backend: default: the current one (`paraflow.current`).
        checkpoint: where commits are written outside horovodrun's elastic mode (default: the
            ``PARAFLOW_ELASTIC_CHECKPOINT`` variable; None: nothing is written, so a restarted
            worker begins again from the start).
        save_every: commits between checkpoint writes (1: every commit).
        **fields: the rest of the state: samplers, scaler, epoch, step, ...
    """

    def __init__(
        self,
        model: Optional[nn.Module] = None,
        optimizer: Optional[torch.optim.Optimizer] = None,
        *,
        backend: Any = None,
        checkpoint: Optional[str] = None,
        save_every: int = 1,
        **fields: Any,
    ) -> None:
        if int(save_every) < 1:
            raise ConfigurationError(f"save_every must be 1 or more commits, got {save_every}.")
        object.__setattr__(self, "_names", [])
        self.backend = backend if backend is not None else current()
        self.checkpoint = checkpoint or os.environ.get("PARAFLOW_ELASTIC_CHECKPOINT") or None
        self.save_every = int(save_every)
        self.commits = 0  # since this process started (or since the last restart)
        self.recoveries = 0  # times the job went back to a commit (rollbacks, or restarts from the checkpoint)
        self._saved: Optional[dict] = None
        self._in_memory = False  # set by the run wrapper under horovodrun's elastic mode
        self._host_messages: queue.Queue = queue.Queue()
        self._last_update = 0
        self._reset_callbacks: list[Callable] = []
        entries = {"model": model, "optimizer": optimizer, **fields}
        for name, value in entries.items():
            if value is None and name in ("model", "optimizer"):
                continue
            if name in _OWN or name.startswith("_"):
                raise ConfigurationError(f"{name!r} is a name of the state itself; give the field another name.")
            self._names.append(name)
            object.__setattr__(self, name, value)

    # ---------------------------------------------------------------- what is kept
    def entries(self) -> dict[str, Any]:
        """The state's objects and values by name, as ``backend.save``/``backend.load`` take them."""
        return {name: getattr(self, name) for name in self._names}

    def describe(self) -> str:
        """The plain fields as ``name=value`` (epoch, step): where the state stands."""
        plain = {n: v for n, v in self.entries().items() if not has_state_dict(v) and isinstance(v, (int, float, str))}
        return ", ".join(f"{n}={v}" for n, v in plain.items()) or f"commit {self.commits}"

    def samplers(self) -> list[ElasticSampler]:
        """The elastic samplers among the fields."""
        return [v for v in self.entries().values() if isinstance(v, ElasticSampler)]

    def _snapshot(self) -> dict:
        snap = {}
        for name, value in self.entries().items():
            if isinstance(value, nn.Module):
                snap[name] = copy.deepcopy(self.backend.unwrap(value).state_dict())
            elif has_state_dict(value):
                snap[name] = copy.deepcopy(value.state_dict())
            else:
                snap[name] = copy.deepcopy(value)
        return snap

    def _load(self, snap: dict) -> None:
        for name, saved in snap.items():
            value = getattr(self, name)
            if isinstance(value, nn.Module):
                self.backend.unwrap(value).load_state_dict(saved)
            elif has_state_dict(value):
                value.load_state_dict(copy.deepcopy(saved))
            else:
                object.__setattr__(self, name, copy.deepcopy(saved))

    # ---------------------------------------------------------------- commit and restore
    def commit(self) -> None:
        """Mark this point as the one to go back to; a collective call, on every rank at the same step.

        Raises:
            HostsUpdated: under horovodrun's elastic mode, hosts were added or removed (the run
                wrapper catches it).
        """
        self.commits += 1
        self.save()
        self.check_host_updates()

    def save(self) -> None:
        """Keep the state: in memory under horovodrun's elastic mode, else every `save_every`-th
        call to `checkpoint` (a collective call)."""
        if self._in_memory:
            self._saved = self._snapshot()
        elif self.checkpoint and self.commits % self.save_every == 0:
            self.backend.save(self.checkpoint, self.entries())

    def restore(self) -> bool:
        """Go back to the last commit (in memory, else `checkpoint` when it exists); False when
        there is none to go back to. A collective call outside horovodrun's elastic mode."""
        if self._in_memory:
            if self._saved is None:
                return False
            self._load(self._saved)
            return True
        if not self.checkpoint or not os.path.exists(self.checkpoint):
            return False
        entries = self.entries()
        self.backend.load(self.checkpoint, entries)
        for name, value in entries.items():  # plain values come back in the mapping
            object.__setattr__(self, name, value)
        return True

    def sync(self) -> None:
        """Give every rank rank 0's state (a worker that joined has none); a collective call."""
        mine = (self._snapshot(), self._last_update) if self.backend.rank == 0 else None
        snap, self._last_update = broadcast_object(self.backend, mine, src=0)  # host news heard: rank 0's
        if self.backend.rank != 0:
            self._load(snap)
        if self._in_memory:
            self._saved = self._snapshot()

    # ---------------------------------------------------------------- membership changes
    def register_reset_callbacks(self, callbacks: Iterable[Callable]) -> None:
        """Call each of `callbacks` after every membership change, with the new world size when it
        takes one argument (rescale the learning rate, rebuild loaders), else with none."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """After a membership change: deal out the samplers' epochs anew, then call the callbacks."""
        self._host_messages = queue.Queue()
        backend = self.backend
        for sampler in self.samplers():
            sampler.reset(backend.world_size, backend.rank)
        for callback in self._reset_callbacks:
            if _takes_an_argument(callback):
                callback(backend.world_size)
            else:
                callback()

    def on_hosts_updated(self, timestamp: int, update: int) -> None:
        """Horovod's notice of added or removed hosts (called from its notification thread)."""
        self._host_messages.put((timestamp, int(update)))

    def check_host_updates(self) -> None:
        """Raise HostsUpdated on every rank once any rank has heard of a host change; a collective
        call under horovodrun's elastic mode, nothing elsewhere."""
        if not self._in_memory:
            return
        latest, update = self._last_update, 0
        while not self._host_messages.empty():
            timestamp, what = self._host_messages.get()
            if timestamp > latest:
                latest, update = timestamp, update | what
        # Any rank's news counts on every rank: the latest time, and whether hosts went or came.
        flags = [latest, int(bool(update & _REMOVED)), int(bool(update & ~_REMOVED))]
        seen = self.backend.allreduce(torch.tensor(flags, dtype=torch.int64), op="max").tolist()
        if seen[0] > self._last_update:
            self._last_update = seen[0]
            raise HostsUpdated(skip_sync=not seen[2])

    def __repr__(self) -> str:
        return f"<paraflow.elastic.State {', '.join(self._names)}; {self.commits} commits>"


_REMOVED = 1  # horovod's HostUpdateResult.removed (2: added)


def _takes_an_argument(callback: Callable) -> bool:
    try:
        inspect.signature(callback).bind(0)
    except TypeError:
        return False
    except ValueError:  # no signature (a builtin): call it without
        return False
    return True


#: Horovod's name for the same object.
TorchState = State
