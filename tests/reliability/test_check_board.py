"""The shared-memory board the ranks of one host post their descriptors on (check_board.py)."""

import mmap
import sys
from types import SimpleNamespace

import pytest
import torch

from paraflow.core import repeated_call
from paraflow.core.collectives import Collectives
from paraflow.errors import CollectiveError
from paraflow.reliability import check_board
from paraflow.reliability.activity import Activity
from paraflow.reliability.check_board import SLOTS, CheckBoard, on_board
from paraflow.reliability.check_bundle import BUNDLE_AFTER
from paraflow.reliability.check_exchange import _call_facts
from paraflow.reliability.collective_check import _PACK, _Descriptor, _words

SIZE = 8 + 2 * SLOTS * (8 + 8 * 26)


def boards(n=2):
    memory = mmap.mmap(-1, SIZE)  # anonymous: one process plays every rank
    return [CheckBoard(memory, n, rank) for rank in range(n)]


def words(sequence, numel=5000, collective="allreduce", op=0, site="train.py:10"):
    return _words(collective, sequence, torch.empty(numel), op, site)


def test_each_rank_reads_every_descriptor_of_a_call():
    b0, b1 = boards()
    b0.post(7, words(7))
    b1.post(7, words(7, numel=6000))
    rows = b0.rows(7)
    assert rows == b1.rows(7)
    assert rows[0] != rows[1] and len(rows[0]) == 26 * 8


def test_the_next_calls_use_other_slots():
    b0, b1 = boards()
    for sequence in range(1, SLOTS + 1):
        b0.post(sequence, words(sequence))
        b1.post(sequence, words(sequence))
    b1.post(SLOTS + 1, words(SLOTS + 1, numel=1))  # rank 1 already in its next call
    assert b0.rows(SLOTS)[1] == b0.rows(SLOTS)[0], "the next call overwrote this one"


def test_a_rank_that_never_posted_shows_its_old_descriptor_after_a_bounded_wait(monkeypatch):
    monkeypatch.setattr(check_board, "_STAMP_WAIT_S", 0.05)
    b0, b1 = boards()
    b1.post(3, words(3, collective="broadcast"))
    b0.post(3 + SLOTS, words(3 + SLOTS))
    rows = b0.rows(3 + SLOTS)
    assert rows[0] != rows[1]


def fake_backend(rank, n=2):
    """A backend whose 'collective' completes at once and returns its input."""
    return SimpleNamespace(
        rank=rank, world_size=n, device=torch.device("cpu"), _start_allreduce=lambda t, op: lambda: t
    )


def test_agreeing_ranks_get_their_result_and_a_different_call_raises_on_every_rank():
    spec = ("allreduce", torch.float32, (5000,), "sum", None)
    b0, b1 = boards()
    mine = torch.ones(5000)
    b1.post(11, words(11))
    finish = on_board(fake_backend(0), b0, spec, words(11), lambda: lambda: mine)
    assert finish() is mine
    b1.post(12, words(12, collective="barrier"))
    with pytest.raises(CollectiveError, match="ranks called different collectives"):
        on_board(fake_backend(0), b0, spec, words(12), lambda: lambda: mine)


def test_every_rank_making_the_same_other_call_is_not_an_error():
    spec = ("allreduce", torch.float32, (5000,), "sum", None)
    b0, b1 = boards()
    b1.post(5, words(5, numel=6000))
    assert on_board(fake_backend(0), b0, spec, words(5, numel=6000), None) is None


def test_agree_is_true_only_when_every_rank_posted_the_same_call():
    b0, b1 = boards()
    b0.post(9, words(9))
    assert not b0.agree(9), "rank 1 has not posted yet"
    b1.post(9, words(9, site="other.py:3"))  # the call site is not compared
    assert b0.agree(9) and b1.agree(9)
    b1.post(9 + SLOTS, words(9 + SLOTS, op=3))
    b0.post(9 + SLOTS, words(9 + SLOTS))
    assert not b0.agree(9 + SLOTS)


class Repeating(Collectives):
    """Rank 0 of two, its board open, after `calls` agreed allreduces of float32[5000] (sum); its
    collectives return their input at once, and a call the short path declines returns SLOW."""

    rank, world_size, device, name = 0, 2, torch.device("cpu"), "fake"

    def __init__(self, board, calls: int) -> None:
        _, key, _, _, spec = _call_facts("allreduce", torch.float32, torch.Size([5000]), "sum", None, "t.py:1", True)
        self._check_board, self._agreed_run, self._traced = board, (key, spec, calls), False
        self._connected, self.collective_count, self.ran = True, 20, []

    def _allreduce(self, tensor, op):
        self.ran.append((op, self._activity and self._activity.state))
        return tensor

    def _allreduce_checked(self, tensor, op, copy):
        return SLOW

    def _broadcast_checked(self, tensor, src, copy):
        return SLOW


SLOW = torch.zeros(1)


def test_the_repeated_call_takes_the_short_path_and_keeps_the_check():
    b0, b1 = boards()
    mine = torch.ones(5000)
    backend = Repeating(b0, BUNDLE_AFTER)
    b1.post(21, words(21))
    site = f"test_check_board.py:{sys._getframe().f_lineno + 1}"
    assert backend.allreduce_(mine) is mine and len(backend.ran) == 1
    assert backend.collective_count == 21
    assert _Descriptor(list(_PACK.unpack(b1.rows(21)[0]))).site == site, "the posted descriptor names the script's line"
    b1.post(22, words(22))
    copied = backend.allreduce(mine, "sum")
    assert copied is not mine and torch.equal(copied, mine) and len(backend.ran) == 2
    assert backend.allreduce(mine) is SLOW  # the copying allreduce's default op is mean: another call
    for declined in (torch.ones(6000), torch.ones(5000, dtype=torch.float64), torch.ones(5000)):
        op = "max" if declined.shape == mine.shape and declined.dtype == mine.dtype else "sum"
        backend.allreduce_(declined, op)  # another shape, dtype, op
        assert not declined.any(), "the slow path's SLOW (zeros) was copied in"
    assert backend.broadcast(mine, 0) is SLOW and len(backend.ran) == 2
    backend._agreed_run = (*backend._agreed_run[:2], BUNDLE_AFTER - 1)
    assert backend.allreduce(mine, "sum") is SLOW  # not yet repeated often enough
    backend._agreed_run = (*backend._agreed_run[:2], BUNDLE_AFTER)
    backend._traced = True
    assert backend.allreduce(mine, "sum") is SLOW  # PARAFLOW_DEBUG: every descriptor is traced by exchange()
    backend._traced, backend._connected = False, False
    assert backend.allreduce(mine, "sum") is SLOW  # shut down: the usual path says so
    backend._connected = True
    b1.post(23, words(23, collective="broadcast"))
    with pytest.raises(CollectiveError, match="ranks called different collectives"):
        backend.allreduce_(mine)
    assert backend._agreed_run is None  # after a mismatch nothing agreed before takes a short path
    assert backend.allreduce_(mine) is mine and len(backend.ran) == 3


def test_the_short_path_marks_the_call_for_the_stall_report_and_translates_failures(monkeypatch):
    b0, b1 = boards()
    backend = Repeating(b0, BUNDLE_AFTER)
    backend._activity = Activity()
    b1.post(21, words(21))
    backend.allreduce_(torch.ones(5000))
    during = backend.ran[0][1]
    assert (during.call, during.waits, during.site.partition(":")[0]) == ("allreduce", True, "test_check_board.py")
    after = backend._activity.state
    assert (after.call, after.after, after.waits, after.site) == ("idle", "allreduce", False, during.site)

    translated = []
    monkeypatch.setattr(repeated_call, "raise_translated", lambda b, name, exc, started: translated.append((name, exc)))
    lost = RuntimeError("Connection closed by peer")

    def fails(tensor, op):
        raise lost

    backend._allreduce = fails
    with pytest.raises(RuntimeError):
        backend.allreduce_(torch.ones(5000))
    assert translated == [("allreduce", lost)] and backend._agreed_run is None
    assert backend._activity.state.call == "idle", "a failed call leaves the stall report's phase"


def test_a_call_made_with_no_python_caller_takes_the_general_path():
    import _thread
    import threading

    b0, _ = boards()
    backend, done = Repeating(b0, BUNDLE_AFTER), threading.Event()
    backend._allreduce_checked = lambda tensor, op, copy: (done.set(), SLOW)[1]
    _thread.start_new_thread(backend.allreduce, (torch.ones(5000), "sum"))  # the thread calls it from C
    assert done.wait(10) and backend.ran == []
