"""A loop's repeated collective, made again once the cross-rank check's board is open: the short path.

The same check as the board's in :func:`paraflow.reliability.check_exchange.exchange` (this rank
posts its descriptor, the collective runs, every rank's descriptor is read), the same error
translation and stall bookkeeping as every public call, in as few steps as they allow: on a host
whose cores the communication shares, each step right after a collective's wait costs
microseconds (code that takes 6 µs warm took 25-37 µs there).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch

from ..reliability.check_bundle import BUNDLE_AFTER
from ..reliability.check_exchange import forget_agreements, packed_descriptor
from ..reliability.collective_check import is_library, site_of
from ..reliability.translation import raise_translated

__all__ = ["RepeatedCall"]


class RepeatedCall:
    """The short path of :class:`paraflow.core.collectives.Collectives`' public calls."""

    # The cross-rank check's state (paraflow.reliability.check_exchange): the board once opened,
    # the run of agreed calls, whether PARAFLOW_DEBUG traces, and the repeated call's last site
    # and packed descriptor (spec, code, bytecode offset, site, descriptor).
    _check_board = _agreed_run = _traced = _repeat_descriptor = None

    def _repeat(self, collective: str, tensor: Any, argument: Any, copy: bool) -> Any:
        """The call every rank agreed on BUNDLE_AFTER times in a row, made again with the board
        open (a loop's steady state), or None when this is not that call (``_checked`` makes it).

        `argument` is the allreduce op or the broadcast source (None for allgather). Called by
        the public calls only: their caller is the script (or the library code that leads to it).
        """
        state, board = self._agreed_run, self._check_board
        if not board or state is None or state[2] < BUNDLE_AFTER or self._traced is not False:
            return None  # no repeated call, no board, or PARAFLOW_DEBUG traces every descriptor
        spec = state[1]  # (collective, dtype, shape, op, src), None for a barrier
        if (
            spec is None
            or spec[0] != collective
            or not isinstance(tensor, torch.Tensor)
            or tensor.dtype is not spec[1]
            or tensor.shape != spec[2]
            or argument != spec[3 if collective == "allreduce" else 4]
            or not self._connected
        ):
            return None
        try:
            caller = sys._getframe(2)  # the public call's caller
        except ValueError:  # called straight from a new thread's C start: the general path names no site either
            return None
        last = self._repeat_descriptor
        if last is not None and last[0] is spec and last[1] is caller.f_code and last[2] == caller.f_lasti:
            site, descriptor = last[3], last[4]  # the same line of the script as last time
        else:
            site = site_of(caller)
            descriptor = packed_descriptor(spec, site)
            if not is_library(caller):  # the caller is the site: remembered by its line
                self._repeat_descriptor = (spec, caller.f_code, caller.f_lasti, site, descriptor)
        started, activity = time.monotonic(), self._activity
        if activity is not None:
            activity.enter(collective, site)
        try:
            self.collective_count += 1
            sequence = self.collective_count
            board.post_packed(sequence, descriptor)
            work = tensor.detach().clone() if copy else tensor.detach() if tensor.requires_grad else tensor
            if collective == "allreduce":
                result = self._allreduce(work, argument)
            elif collective == "broadcast":
                result = self._broadcast(work, argument)
            else:
                result = self._allgather(work.contiguous())
            board.confirm(sequence)
            return result
        except Exception as exc:
            forget_agreements(self)  # a mismatch or a failure: nothing agreed before is repeated
            if isinstance(exc, RuntimeError):
                raise_translated(self, collective, exc, started)
            raise
        finally:
            if activity is not None:
                activity.leave(collective)
