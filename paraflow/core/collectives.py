"""The public collectives every backend shares: each is one call into the backend's library.

A public call checks its input, records this rank's phase for the stall report
(:mod:`paraflow.reliability.activity`), makes one library collective through a subclass hook
(``_allreduce``, ``_broadcast``, ``_allgather``, optionally ``_barrier``) and translates a
communication failure into a paraflow error (:mod:`paraflow.reliability.translation`). With
``check_collectives`` (``PARAFLOW_DEBUG=1``) a small descriptor allgather before the call first
checks that every rank makes the same one (:mod:`paraflow.reliability.collective_check`).
Without it each rank folds its calls into a digest, compared once, in place of the final barrier
(:meth:`Collectives._final_barrier`).
"""

from __future__ import annotations

import contextlib
import time
import zlib
from collections import deque
from typing import Any, Callable, ContextManager

import torch

from ..errors import ConfigurationError, NotInitializedError
from ..reliability.activity import call_site
from ..reliability.collective_check import (
    check_same_call,
    decode_calls,
    encode_calls,
    recorded_mismatch_error,
)
from ..reliability.translation import raise_translated
from .options import REDUCE_OPS

__all__ = ["Collectives", "fold"]


class Collectives:
    """allreduce, broadcast, allgather and barrier over the ranks of an initialised backend.

    ``collective_count`` is the number of public collectives this rank has made in a job of
    several processes.
    """

    collective_count = 0
    #: This rank's phase for the stall report (paraflow.reliability.activity); None in one process.
    _activity = None
    #: This rank's public collectives folded into one number (:func:`fold`).
    calls_digest = 0
    _digest_before = 0
    #: How many of its first and of its latest calls a rank keeps, to name a mismatch found later.
    KEPT_FIRST, KEPT_LATEST = 8, 32

    def __init__(self) -> None:
        self._first_calls: list = []
        self._latest_calls: deque = deque(maxlen=self.KEPT_LATEST)

    def allreduce(self, tensor: torch.Tensor, op: str = "mean") -> torch.Tensor:
        """Reduce `tensor` over all ranks with `op` (sum, mean, min, max); input is unchanged."""
        self._check_allreduce(tensor, op)
        result = self._call("allreduce", tensor, op, lambda: self._allreduce(tensor.detach().clone(), op))
        return result.to(tensor.device)

    def allreduce_(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Reduce `tensor` over all ranks with `op`, in place (no copy); returns `tensor`."""
        self._check_allreduce(tensor, op)
        return self._into(tensor, self._call("allreduce", tensor, op, lambda: self._allreduce(tensor.detach(), op)))

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Return rank `src`'s `tensor` on every rank; input is unchanged."""
        self._check_broadcast(tensor, src)
        result = self._call("broadcast", tensor, src, lambda: self._broadcast(tensor.detach().clone(), src))
        return result.to(tensor.device)

    def broadcast_(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Overwrite `tensor` with rank `src`'s, in place (no copy); returns `tensor`."""
        self._check_broadcast(tensor, src)
        return self._into(tensor, self._call("broadcast", tensor, src, lambda: self._broadcast(tensor.detach(), src)))

    def allgather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Return every rank's `tensor` (same shape on all ranks), indexed by rank."""
        self._check_tensor(tensor, "allgather")
        gathered = self._call("allgather", tensor, None, lambda: self._allgather(tensor.detach().contiguous()))
        return [t.to(tensor.device) for t in gathered]

    def barrier(self) -> None:
        """Wait until every rank reaches this call."""
        self._live()
        self._call("barrier", None, None, self._barrier)

    def _call(self, collective: str, tensor: Any, argument: Any, run: Callable[[], Any]) -> Any:
        """Run one public collective: `run()` makes the library call; `argument` is the op or source."""
        site = call_site()
        started, activity = time.monotonic(), self._activity
        if activity is not None:
            activity.enter(collective, site, (self.collective_count + 1, tensor, argument))
        try:
            if self.env.world_size > 1:
                self.collective_count += 1
                if self.check_collectives:
                    check_same_call(self, self.collective_count, collective, tensor, argument, site)
                self._keep_call(collective, tensor, argument, site)
            return run()
        except (RuntimeError, ValueError) as exc:
            if activity is not None:
                activity.failed()
            self._raise_failure(collective, tensor, argument, exc, started)
            raise
        finally:
            if activity is not None:
                activity.leave(collective)

    def _keep_call(self, collective: str, tensor: Any, argument: Any, site: str) -> None:
        """Fold the call about to be made into the digest and keep it among the first or latest."""
        dtype, shape = (None, ()) if tensor is None else (tensor.dtype, tensor.shape)
        self._digest_before = self.calls_digest
        self.calls_digest = fold(self.calls_digest, collective, dtype, shape, argument)
        record = (collective, self.collective_count, dtype, shape, argument, site)
        (self._first_calls if self.collective_count <= self.KEPT_FIRST else self._latest_calls).append(record)

    def _kept_calls_of_every_rank(self) -> list:
        """Every rank's kept calls (collective_check.decode_calls), by rank: one allgather."""
        mine = encode_calls([*self._first_calls, *self._latest_calls]).to(self.device)
        return [decode_calls(row) for row in self._allgather(mine)]

    def _mismatch_seen_by_the_library(self, where: str) -> Exception:
        """The error for the library's report that the ranks' current calls differ (every rank got
        it): every rank's call named, from one allgather of the kept calls. The failed call no
        longer counts in the digest, since it did not happen."""
        self.calls_digest = self._digest_before
        kept = self._kept_calls_of_every_rank()
        (self._latest_calls or self._first_calls).pop()
        return recorded_mismatch_error(where, kept, number=self.collective_count)

    def _final_barrier(self) -> None:
        """The barrier that ends the job, as one allgather of each rank's count and digest of its
        public collectives; raises the same CollectiveError on every rank when they differ."""
        mine = torch.tensor([self.collective_count, self.calls_digest], dtype=torch.int64, device=self.device)
        gathered = self._allgather(mine)
        _wait_until_released([mine, *gathered])
        rows = [tuple(row.tolist()) for row in gathered]
        if len(set(rows)) > 1:
            raise recorded_mismatch_error(
                f"the check at the end of the job on rank {self.rank} of {self.world_size} (backend {self.name}) "
                f"found that the ranks made different collectives, which the communication library did not "
                f"stop, so results that came from them may be wrong",
                self._kept_calls_of_every_rank(),
                [count for count, _ in rows],
            )

    def _marked(self, call: str) -> ContextManager:
        """Record `call` as this rank's phase while it runs (read only by the stall report)."""
        return contextlib.nullcontext() if self._activity is None else self._activity.call(call)

    @staticmethod
    def _into(tensor: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
        """`tensor`, holding `result` (a backend may return the result in other memory)."""
        if result is not tensor and result.data_ptr() != tensor.data_ptr():
            tensor.detach().copy_(result)
        return tensor

    # ---------------------------------------------------------------- for subclasses
    def _allreduce(self, tensor: torch.Tensor, op: str) -> torch.Tensor:
        """Reduce `tensor` (the caller's or a private copy) in place or not; return the result."""
        raise NotImplementedError

    def _broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        """Broadcast `tensor` from `src` and return the result."""
        raise NotImplementedError

    def _allgather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Gather `tensor` from every rank, indexed by rank."""
        raise NotImplementedError

    def _barrier(self) -> None:
        """Block until every rank arrives (default: a one-element allreduce)."""
        self._allreduce(torch.zeros(1, device=self.device), "sum")

    def _raise_failure(self, collective: str, tensor: Any, argument: Any, exc: Exception, started: float) -> None:
        """Raise the paraflow error for the library's `exc` in a public `collective` (begun at
        time.monotonic() `started`), the one translation it gets; return to let `exc` go unchanged."""
        if isinstance(exc, RuntimeError):
            raise_translated(self, collective, exc, started)

    # ---------------------------------------------------------------- input checks
    def _check_allreduce(self, tensor: Any, op: str) -> None:
        self._check_tensor(tensor, "allreduce")
        if op not in REDUCE_OPS:
            raise ConfigurationError(f"allreduce op {op!r} is not one of {', '.join(REDUCE_OPS)}.")
        if op == "mean" and not (tensor.is_floating_point() or tensor.is_complex()):
            raise ConfigurationError(
                f"allreduce op 'mean' needs a floating-point tensor, got {tensor.dtype}; "
                "use op='sum' and divide, or convert with tensor.double()."
            )

    def _check_broadcast(self, tensor: Any, src: int) -> None:
        self._check_tensor(tensor, "broadcast")
        world_size = self.env.world_size  # the launcher's (the public call checked the backend is live)
        if not 0 <= src < world_size:
            raise ConfigurationError(f"broadcast src={src} is outside ranks 0..{world_size - 1}.")

    def _check_tensor(self, tensor: Any, collective: str) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise ConfigurationError(f"{collective} takes a torch.Tensor, got {type(tensor).__name__}.")
        self._live()

    def _live(self) -> None:
        """Raise NotInitializedError unless communication has started and the backend is not shut down."""
        if not self._connected:
            raise self._not_initialized()

    def _not_initialized(self) -> NotInitializedError:
        return NotInitializedError(f"backend {self.name!r} is not initialised (or was shut down); call init() first.")


_CODES: dict = {}  # (collective, dtype, argument) -> a code that is the same in every process


def fold(digest: int, collective: str, dtype: Any, shape: tuple, argument: Any) -> int:
    """`digest` with one call folded in: equal on two ranks only if their calls were (the code of
    the strings is a CRC, since Python's str hash differs from process to process)."""
    key = (collective, dtype, argument)
    code = _CODES.get(key)
    if code is None:
        if len(_CODES) > 4096:
            _CODES.clear()
        code = _CODES[key] = zlib.crc32(repr(key).encode())
    return hash((digest, code, shape))  # torch.Size hashes as the tuple of its sizes


#: The longest the end of the job waits for the library to let go of its last collective's tensors.
RELEASE_WAIT_S = 5.0


def _wait_until_released(tensors: list) -> None:
    """Wait, with the GIL released, until the library holds none of `tensors` any more (at most
    RELEASE_WAIT_S).

    A library thread (gloo's) lets go of a collective's tensors only after the caller's wait has
    returned, and letting go of a tensor Python made takes the GIL. After the job's last collective
    the main thread may soon hold the GIL for good: joining that very thread while the process
    group is freed with the model (a deadlock), or ending the interpreter, which ends a thread
    asking for the GIL inside a C++ destructor (the process aborts: "terminate called without an
    active exception", after a run that did all its work).
    """
    if not all(hasattr(t, "_use_count") for t in tensors):  # a torch that does not say: give the thread a moment
        time.sleep(0.05)
        return
    deadline = time.monotonic() + RELEASE_WAIT_S
    while any(t._use_count() > 1 for t in tensors) and time.monotonic() < deadline:
        time.sleep(0.001)
