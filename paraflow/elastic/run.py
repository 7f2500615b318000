"""The run wrapper: restore the last commit and go on after a worker is lost or hosts change."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, TypeVar

from ..environment.launchers import registered_launchers
from ..errors import CollectiveError, ConfigurationError
from ..reliability.translation import translate_escaped_error
from ..training.checkpoint import atomic_write
from ..training.object_collectives import broadcast_object
from .state import HostsUpdated, State

__all__ = ["run", "recovery_mode", "NotElasticError"]

F = TypeVar("F", bound=Callable[..., Any])


class NotElasticError(CollectiveError):
    """A worker was lost under a launcher that cannot replace it; names the launchers that can."""


def recovery_mode(backend: Any) -> str:
    """How this job survives a lost worker: "rollback" (horovodrun's elastic mode: in process),
    "restart" (torchrun with restarts: from the last checkpoint) or "once" (it does not)."""
    launcher = backend.env.launched_by
    if not launcher.launched_elastic(os.environ):
        return "once"
    return launcher.recovery or "once"


def run(func: F) -> F:
    """Run ``func(state, *args, **kwargs)`` so that it survives lost and added workers.

    - horovodrun's elastic mode (``--min-np/--max-np``, horovod backend): rank 0's state is
      given to every rank, then `func` runs; when a worker is lost the survivors restore the
      last ``state.commit()`` in memory, start horovod again at the new size, call the reset
      callbacks and enter `func` again; when hosts are added or removed, ``commit()`` raises on
      every rank and `func` is entered again at the new size without rolling back.
    - torchrun with ``--max-restarts`` (and any other launcher): the state is restored from its
      checkpoint when one exists (a restarted worker), then `func` runs once; a lost worker, or
      a host whose agent joins, ends this attempt and torchrun's agents start every worker again.
    - a launcher that cannot restart (mpirun, srun): `func` runs once; a lost worker ends the
      job with NotElasticError, naming the launchers that could have kept it going.

    Horovod's ``hvd.elastic.run`` under the same name, for every backend.
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        mode = recovery_mode(state.backend)
        if mode == "rollback":
            return _rollback(func, state, args, kwargs)
        return _from_checkpoint(func, state, mode, args, kwargs)

    return wrapper  # type: ignore[return-value]


def _say(state: State, text: str) -> None:
    if state.backend.is_main:
        print(f"paraflow elastic: {text}", file=sys.stderr, flush=True)


def _rollback(func: Callable, state: State, args: tuple, kwargs: dict) -> Any:
    backend = state.backend
    recovery = backend._in_process_recovery()
    if recovery is None:
        raise ConfigurationError(
            f"{backend.env.launcher}'s elastic mode keeps the survivors of a lost worker running, which only "
            f"the horovod backend can do, not {backend.name!r}: add `--backend horovod`, or launch the "
            f"{backend.name} backend with `{_launcher_with('restart').elastic_command}`."
        )
    state._in_memory = True
    recovery.listen(state)
    skip_sync = False
    try:
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HostsUpdated as change:
                skip_sync, what, lost_at = change.skip_sync, "hosts were added or removed", None
            except Exception as exc:  # noqa: BLE001 - anything else goes on up below
                if not recovery.lost_peer(exc):
                    raise
                lost_at = time.monotonic()
                state.restore()
                state.recoveries += 1
                skip_sync, what = False, f"a worker was lost ({_first_line(exc)}); rolled back to {state.describe()}"
            before = backend.world_size
            recovery.reset()
            state.on_reset()
            took = f" in {time.monotonic() - lost_at:.1f} s" if lost_at is not None else ""
            _say(state, f"{what}; going on with {backend.world_size} processes (were {before}){took}")
    finally:
        recovery.forget(state)


def _job_checkpoint(backend: Any) -> str:
    """Where a restarting job on one host keeps its commits when no checkpoint is given: a folder
    named after the agent (the workers' parent, the same across restarts) under the temporary directory."""
    if backend.local_world_size != backend.world_size:
        raise ConfigurationError(
            "an elastic job across hosts keeps its commits in a checkpoint every host reads: give "
            "State(checkpoint=PATH) (train.py --checkpoint PATH) on a file system they share."
        )
    key = re.sub(r"[^A-Za-z0-9_.-]", "_", os.environ.get("TORCHELASTIC_RUN_ID", "job"))[:60]
    folder = os.path.join(tempfile.gettempdir(), f"paraflow-{os.getuid()}", f"elastic-{key}-{os.getppid()}")
    return os.path.join(folder, "state.pt")


def _from_checkpoint(func: Callable, state: State, mode: str, args: tuple, kwargs: dict) -> Any:
    backend = state.backend
    own_folder = None
    if state.checkpoint is None and mode == "restart":
        state.checkpoint = _job_checkpoint(backend)
        own_folder = os.path.dirname(state.checkpoint)
    if state.restore():
        state.recoveries = _count_restore(state)
        _say(
            state,
            f"restart {state.recoveries}: restored {state.describe()} from {state.checkpoint}; "
            f"going on with {backend.world_size} processes",
        )
    try:
        result = func(state, *args, **kwargs)
    except Exception as exc:
        if mode != "once" or not (isinstance(exc, CollectiveError) or translate_escaped_error(backend, exc)):
            raise
        launcher = backend.env.launched_by
        able = "; ".join(f"`{x.elastic_command}`" for x in registered_launchers() if x.elastic_command)
        raise NotElasticError(
            f"{exc}\n{launcher.label or launcher.name} was not launched to replace a lost worker "
            f"(it cannot, or was started without its elastic options), so this elastic job ends here. "
            f"Launch it elastically: {able}."
        ) from exc
    if own_folder is not None:  # done: the commits are no longer needed
        backend.barrier()
        if backend.is_main:
            shutil.rmtree(own_folder, ignore_errors=True)
    elif state.checkpoint and backend.rank == 0:  # the checkpoint stays; a job that restores it counts anew
        with contextlib.suppress(OSError):
            os.remove(_restores_file(state))
    return result


def _count_restore(state: State) -> int:
    """The times this job has gone back to its checkpoint, this one included; a collective call.

    torchrun's TORCHELASTIC_RESTART_COUNT cannot say it: each agent counts only its own failed
    attempts, not the restarts of a membership change (a host that joins), and an agent that
    joined starts at 0. So rank 0 keeps the count in a file next to the checkpoint."""
    backend = state.backend
    count = None
    if backend.rank == 0:
        path = _restores_file(state)
        try:
            with open(path) as f:
                count = int(f.read().strip()) + 1
        except (OSError, ValueError):
            count = 1
        atomic_write(path, lambda f: f.write(str(count).encode()))
    return int(broadcast_object(backend, count, src=0))


def _restores_file(state: State) -> str:
    return f"{os.path.normpath(state.checkpoint)}.restores"


def _launcher_with(recovery: str) -> Any:
    return next(x for x in registered_launchers() if x.recovery == recovery)


def _first_line(exc: BaseException, limit: int = 200) -> str:
    text = " ".join(str(exc).split())
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return f"{type(exc).__name__}: {text}"
