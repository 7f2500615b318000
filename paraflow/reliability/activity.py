"""What this rank is doing right now, recorded cheaply for the stall report.

The main thread updates one tuple per paraflow call and per training forward (a few
attribute stores and a look up the stack for the call site: 3-8 µs per step in all, measured
by benchmarks/marker_cost.py); nothing is communicated. The
stall watchdog (:mod:`paraflow.reliability.stall`) reads the tuple from its own thread when a wait
has lasted too long. Phases:

- a paraflow call (``allreduce``, ``save``, ``barrier``, ...): a wait on the other ranks;
- ``forward``: computing, not a wait;
- ``backward``: after a training forward, until the optimizer steps: DDP's gradient allreduce
  waits inside ``loss.backward()``, so this counts as a wait;
- ``optimizer.step``: horovod's wait for the gradient allreduces;
- ``idle``: the script's own code after one of the above (never a wait).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, Optional

import torch

from ..errors import ConfigurationError

__all__ = ["Activity", "State", "attach_markers", "attach_step_marker", "call_site", "site_of", "ranks_text"]


# Frames of these packages are not the user's call site: paraflow itself, the libraries that call
# back into it (torch's module call running a forward hook, horovod's optimizer step), contextlib.
LIBRARIES = frozenset({"paraflow", "torch", "horovod", "contextlib"})
#: paraflow's own programs that call its public API as a script does (the benchmark's ranks): their
#: lines are call sites, and the walk stops there as it does in a user's script.
USER_PROGRAMS = ("paraflow.bench.",)


_LIBRARY_CODE: dict = {}  # code object -> is it library code (a module's code keeps its module)
_SITES: dict = {}  # (code object, bytecode offset) -> "file:line"
_CACHE_LIMIT = 4096  # entries per cache; cleared when full (code made on the fly, in a notebook)


def is_library(frame) -> bool:
    """True for a frame of paraflow (but its USER_PROGRAMS), torch, horovod or contextlib: not
    the user's call site."""
    code = frame.f_code
    known = _LIBRARY_CODE.get(code)
    if known is None:
        if len(_LIBRARY_CODE) >= _CACHE_LIMIT:
            _LIBRARY_CODE.clear()
        name = frame.f_globals.get("__name__", "")
        known = _LIBRARY_CODE[code] = name.partition(".")[0] in LIBRARIES and not name.startswith(USER_PROGRAMS)
    return known


def call_site() -> str:
    """file:line of the script's line that led here: the first caller outside paraflow, torch and
    horovod (every collective asks, so the library test is remembered per code object and the
    site per code object and instruction)."""
    return site_of(sys._getframe(2))


def site_of(frame) -> str:
    """file:line of `frame`, or of its first caller outside paraflow, torch and horovod."""
    known = _LIBRARY_CODE.get  # the cached answer inline; is_library only for code not seen yet
    while frame is not None and ((library := known(frame.f_code)) or (library is None and is_library(frame))):
        frame = frame.f_back
    if frame is None:
        return "?"
    where = (frame.f_code, frame.f_lasti)
    site = _SITES.get(where)
    if site is None:
        if len(_SITES) >= _CACHE_LIMIT:
            _SITES.clear()
        site = _SITES[where] = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
    return site


def ranks_text(ranks: Sequence[int]) -> str:
    """How paraflow's messages name ranks: ``rank 3``, or ``ranks 1, 2`` for several."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


class State(NamedTuple):
    """One snapshot: the phase, where the script entered it, the step, since when, and whether it waits."""

    call: str
    site: str  # "file.py:line"
    step: int
    since: float  # time.monotonic()
    waits: bool
    after: str = ""  # for "idle": the phase it left
    call_args: Any = None  # for a collective: (its number, the tensor or None, the op or source)


#: State from a tuple of every field, in one call: the markers run around every collective and step,
#: where the NamedTuple constructor's own frame costs microseconds after a collective's wait.
_state = functools.partial(tuple.__new__, State)


class Activity:
    """This rank's current phase and training step (forward passes with gradients, counted from 1)."""

    def __init__(self) -> None:
        self.step = 0
        self.passes = 0  # iterations of paraflow's sampler begun (data passes: epochs, or a peek at a batch)
        self.state = State("idle", "start-up", 0, time.monotonic(), False, "paraflow.init")
        self._depth = 0
        # Set by the sampler when this epoch's shards give ranks different batch counts (shard_check).
        self.uneven: dict = {}
        self.joins = 0

    @contextlib.contextmanager
    def call(self, name: str) -> Iterator[None]:
        """Context around one paraflow call; calls made inside it (save's allgathers) keep the outer name."""
        self.enter(name)
        try:
            yield
        except BaseException:
            self.failed()
            raise
        finally:
            self.leave(name)

    def enter(self, name: str, site: Optional[str] = None, call_args: Any = None) -> None:
        """A paraflow call made at `site` (found here if None) begins: what :meth:`call` does on entry.
        A collective passes `call_args`, (its number, the tensor or None, the op or source)."""
        self._depth += 1
        if self._depth == 1:
            self.state = _state((name, site or call_site(), self.step, time.monotonic(), True, "", call_args))

    def leave(self, name: str) -> None:
        """The paraflow call `name` returned or failed: the script's own code runs."""
        self._depth -= 1
        if self._depth == 0:
            self.state = _state(("idle", self.state.site, self.step, time.monotonic(), False, name, None))

    def failed(self) -> None:
        """The current paraflow call failed (its error is on the way out); a subclass may keep the record."""

    def forward_started(self, training: bool, site: str) -> None:
        """A forward pass of the wrapped model begins at `site`; with gradients, it starts a new step."""
        if self._depth:
            return
        if training:
            self.step += 1
        self.state = _state(
            ("forward" if training else "forward (no grad)", site, self.step, time.monotonic(), False, "", None)
        )

    def forward_done(self, training: bool) -> None:
        """The forward returned: a training one is followed by backward (DDP's gradient sync waits there)."""
        if self._depth:
            return
        site = self.state.site
        if training:
            self.state = _state(("backward", site, self.step, time.monotonic(), True, "", None))
        else:
            self.state = _state(("idle", site, self.step, time.monotonic(), False, "forward (no grad)", None))

    def optimizer_stepped(self) -> None:
        """The optimizer's step finished: the script's own code runs until the next marker. Recorded
        once: horovod's gradient wait already records it as it leaves, and torch runs the hook twice
        for horovod's optimizer (a subclass whose step calls its base's)."""
        state = self.state
        if not self._depth and state.after != "optimizer.step":
            self.state = _state(("idle", state.site, self.step, time.monotonic(), False, "optimizer.step", None))


def attach_markers(activity: Activity, model: torch.nn.Module) -> None:
    """Mark the start and end of every forward of `model` in `activity`.

    Before a training forward, an epoch whose shards give the ranks different batch counts
    (``activity.uneven``, set by :mod:`paraflow.training.shard_check`) outside ``backend.join``
    raises ConfigurationError on every rank, before any gradient is exchanged.

    Args:
        activity: this rank's record.
        model: the module ``wrap_model`` returns (DDP's wrapper, or horovod's unwrapped model).
    """
    model.register_forward_pre_hook(_ForwardMarker(activity, start=True))
    model.register_forward_hook(_ForwardMarker(activity, start=False))


def attach_step_marker(activity: Activity, optimizer: torch.optim.Optimizer) -> None:
    """Mark the end of every ``optimizer.step()``: the script's own code runs until the next forward."""
    optimizer.register_step_post_hook(_StepMarker(activity))


class _Marker:
    """A hook that survives ``copy.deepcopy`` and pickling of the object it sits on.

    A closure or bound method would be copied with the model (deepcopy copies a bound method's
    object) or refuse to pickle; this object is shared by copies and goes inert when pickled.
    """

    activity: Optional[Activity]

    def __deepcopy__(self, memo: dict) -> _Marker:
        return self

    def __getstate__(self) -> dict:
        return {**self.__dict__, "activity": None}


class _StepMarker(_Marker):
    def __init__(self, activity: Activity) -> None:
        self.activity = activity

    def __call__(self, *_: object) -> None:
        if self.activity is not None:
            self.activity.optimizer_stepped()


class _ForwardMarker(_Marker):
    """Before (`start`) or after a forward of the model it is registered on."""

    def __init__(self, activity: Activity, start: bool) -> None:
        self.activity, self.start = activity, start

    # Never traced by torch.compile (it reads the caller's frame): a compiled model runs it eagerly.
    @torch.compiler.disable
    def __call__(self, module: torch.nn.Module, *_: object) -> None:
        activity = self.activity
        if activity is None:
            return
        training = module.training and torch.is_grad_enabled()
        if self.start:
            if training and activity.uneven and not activity.joins:
                raise ConfigurationError(next(iter(activity.uneven.values())))
            activity.forward_started(training, site_of(sys._getframe(1)))
        else:
            activity.forward_done(training)
