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

In a job of several processes the same record also goes to a file-backed mapping
(:class:`LastWords`, :class:`RecordedActivity`), which :mod:`paraflow.reliability.last_words`
reads when a rank dies: a public collective is one step here, with no other module on its way.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import mmap
import os
import signal
import struct
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Optional

import torch

from ..errors import ConfigurationError

__all__ = [
    "Activity",
    "LastWords",
    "RecordedActivity",
    "State",
    "attach_markers",
    "attach_step_marker",
    "call_site",
    "read_record",
    "COLLECTIVES",
    "site_of",
    "ranks_text",
]


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


# ---------------------------------------------------------------- the record file
# A job of several processes keeps this rank's activity in a file-backed mapping as well
# (paraflow.reliability.last_words reads it when the rank dies). The record, written in pieces so a
# collective costs one small store on entry and one byte on exit: phase (call, after, site), the last
# public collective (name, number, the code that made it inside another paraflow call, whether the
# rank is inside it), the step, and whether Python's exit ran.
_MAGIC = b"PFLW"
_VERSION = 1
_SIZE = 65536
_HEADER = struct.Struct("<4sIiiid")  # magic, version, pid, rank, world size, started (wall time)
_PHASE_AT, _PHASE = 64, struct.Struct("<iii")
_COLLECTIVE_AT, _COLLECTIVE = 76, struct.Struct("<iqii")
_CALL = struct.Struct("<iiiiqii")  # phase and collective in one store (a collective made by the script)
_INSIDE_AT = 92
_STEP_AT, _STEP = 96, struct.Struct("<q")
_ENDED_AT = 104
_INNER_AT, _INNER_SIZE = 128, 128  # the code that made an inner collective: u8 length + UTF-8 bytes
_TABLE_AT = 256  # strings: u16 length + UTF-8 bytes each, id = position in the table, from 1
_LENGTH = struct.Struct("<H")
#: The public collectives (any other paraflow call, such as save, may make several of them).
COLLECTIVES = frozenset({"allreduce", "broadcast", "allgather", "barrier"})
_OWN_MODULES = frozenset({__name__, "paraflow.core.collectives"})


class LastWords:
    """This rank's record file (writer side) and fault file."""

    def __init__(self, directory: Path, rank: int, world_size: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory, self.rank, self.world_size = directory, rank, world_size
        self.path = directory / f"rank{rank}.rec"
        self.fault_path = directory / f"rank{rank}.fault"
        with open(self.path, "w+b") as f:
            f.truncate(_SIZE)
            self._map = mmap.mmap(f.fileno(), _SIZE)
        _HEADER.pack_into(self._map, 0, _MAGIC, _VERSION, os.getpid(), rank, world_size, time.time())
        self._ids: dict = {"": 0}
        self._table_end = _TABLE_AT
        self._fault_file = open(self.fault_path, "w")  # noqa: SIM115 - open while faulthandler writes to it
        self._had_faulthandler = faulthandler.is_enabled()  # on stderr (PYTHONFAULTHANDLER, torchrun's @record)
        faulthandler.enable(file=self._fault_file, all_threads=True)
        # A launcher ending the job sends SIGTERM: the stacks (with no "Fatal Python error" line) tell
        # a rank ended that way from one that died on its own.
        faulthandler.register(signal.SIGTERM, file=self._fault_file, all_threads=True, chain=True)

    def _id(self, text: str) -> int:
        """The table id of `text`, adding it on first sight (0 when the table is full)."""
        known = self._ids.get(text)
        if known is not None:
            return known
        raw = text.encode("utf-8", "replace")[:512]
        end = self._table_end + _LENGTH.size + len(raw)
        if end > _SIZE:
            return 0
        self._map[self._table_end + _LENGTH.size : end] = raw
        _LENGTH.pack_into(self._map, self._table_end, len(raw))
        self._table_end = end
        self._ids[text] = known = len(self._ids)
        return known

    def phase(self, call: str, after: str, site: str) -> None:
        """Store the phase (memory stores only; a string seen for the first time joins the table)."""
        ids, add = self._ids.get, self._id
        _PHASE.pack_into(self._map, _PHASE_AT, ids(call) or add(call), ids(after) or add(after), ids(site) or add(site))

    def collective(self, name: str, number: int, site: str) -> None:
        """A public collective the script called at `site` begins: phase and collective in one store."""
        ids = self._ids.get
        name_id = ids(name) or self._id(name)
        _CALL.pack_into(self._map, _PHASE_AT, name_id, 0, ids(site) or self._id(site), name_id, number, 0, 1)

    def inner_collective(self, name: str, number: int, inner: str) -> None:
        """A collective made inside another paraflow call (save's allgathers) begins."""
        raw = inner.encode("utf-8", "replace")[: _INNER_SIZE - 1]
        self._map[_INNER_AT + 1 : _INNER_AT + 1 + len(raw)] = raw
        self._map[_INNER_AT] = len(raw)
        _COLLECTIVE.pack_into(self._map, _COLLECTIVE_AT, self._ids.get(name) or self._id(name), number, 1, 1)

    def step(self, step: int) -> None:
        """A training step begins."""
        _STEP.pack_into(self._map, _STEP_AT, step)

    def ended(self) -> None:
        """This process leaves through Python's exit."""
        self._map[_ENDED_AT] = 1

    def close(self) -> None:
        """Stop writing and delete both files (a clean end of the job)."""
        faulthandler.unregister(signal.SIGTERM)
        if self._had_faulthandler:
            faulthandler.enable(file=sys.stderr, all_threads=True)
        else:
            faulthandler.disable()
        self._fault_file.close()
        for path in (self.path, self.fault_path):
            path.unlink(missing_ok=True)
        try:
            self.directory.rmdir()  # the last rank out removes the directory
        except OSError:
            pass


class RecordedActivity(Activity):
    """An :class:`Activity` that also keeps its record in a :class:`LastWords` mapping."""

    def __init__(self, last_words: LastWords) -> None:
        super().__init__()
        self.last_words = last_words
        self._map = last_words._map
        self.frozen = False  # a call failed: the record keeps it while the error leaves the calls around it
        self.ended = False
        state = self.state
        last_words.phase(state.call, state.after, state.site)

    def enter(self, name: str, site: Optional[str] = None, call_args: Any = None) -> None:
        Activity.enter(self, name, site, call_args)
        self.frozen = False
        if call_args is None:
            if self._depth == 1:
                self.last_words.phase(name, "", self.state.site)
        elif self._depth == 1:
            self.last_words.collective(name, call_args[0], self.state.site)
        else:
            self.last_words.inner_collective(name, call_args[0], _inner_site(call_args[1]))

    def leave(self, name: str) -> None:
        Activity.leave(self, name)
        if self.frozen:
            return
        self._map[_INSIDE_AT] = 0  # the collective returned (a call that is none has none open: no harm)
        if self._depth == 0 and name not in COLLECTIVES:
            self.last_words.phase("idle", name, self.state.site)

    def failed(self) -> None:
        """The current call failed: the record keeps it while the error leaves the calls around it."""
        self.frozen = True

    def forward_started(self, training: bool, site: str) -> None:
        Activity.forward_started(self, training, site)
        if not self._depth:
            self.frozen = False
            state = self.state
            self.last_words.step(state.step)
            self.last_words.phase(state.call, "", site)

    def forward_done(self, training: bool) -> None:
        Activity.forward_done(self, training)
        if not self._depth:
            state = self.state
            self.last_words.phase(state.call, state.after, state.site)

    def optimizer_stepped(self) -> None:
        Activity.optimizer_stepped(self)
        if not self._depth:
            self.last_words.phase("idle", "optimizer.step", self.state.site)


def _inner_site(tensor: Any) -> str:
    """file:line of the code that made a collective inside another paraflow call (save's allgathers),
    and its tensor's size and dtype: ranks in different collectives of one call differ here."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__") in _OWN_MODULES:
        frame = frame.f_back
    where = "?" if frame is None else f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
    if tensor is None or not hasattr(tensor, "numel"):
        return where
    return f"{where}, {tensor.numel()} {str(tensor.dtype).replace('torch.', '')}"


def read_record(path: Path) -> Optional[dict]:
    """A rank's record as a dict, or None when `path` holds none (missing, short or foreign)."""
    try:
        raw = Path(path).read_bytes()
    except OSError:
        return None
    if len(raw) < _TABLE_AT:
        return None
    magic, version, pid, rank, world_size, started = _HEADER.unpack_from(raw, 0)
    if magic != _MAGIC or version != _VERSION:
        return None
    strings, at = [""], _TABLE_AT
    while at + _LENGTH.size <= len(raw):
        (length,) = _LENGTH.unpack_from(raw, at)
        if not length:
            break
        strings.append(raw[at + _LENGTH.size : at + _LENGTH.size + length].decode("utf-8", "replace"))
        at += _LENGTH.size + length
    call, after, site, collective, number, inner, inside = _CALL.unpack_from(raw, _PHASE_AT)
    (step,) = _STEP.unpack_from(raw, _STEP_AT)
    ended = raw[_ENDED_AT]

    def text(i: int) -> str:
        return strings[i] if 0 <= i < len(strings) else "?"

    returned = call and call == collective and not inside  # a collective the script called has returned
    return {
        "pid": pid,
        "rank": rank,
        "world_size": world_size,
        "started": started,
        "call": "idle" if returned else text(call),
        "after": text(collective if returned else after),
        "site": text(site),
        "inner": raw[_INNER_AT + 1 : _INNER_AT + 1 + raw[_INNER_AT]].decode("utf-8", "replace") if inner else "",
        "collective": text(collective),
        "number": number,
        "inside": bool(inside),
        "ended": bool(ended),
        "step": step,
    }
