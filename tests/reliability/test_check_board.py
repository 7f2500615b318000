"""The shared-memory board the ranks of one host post their descriptors on (check_board.py)."""

import mmap
from types import SimpleNamespace

import pytest
import torch

from paraflow.errors import CollectiveError
from paraflow.reliability import check_board
from paraflow.reliability.check_board import SLOTS, CheckBoard, on_board
from paraflow.reliability.collective_check import _words

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


def repeating_backend(board, calls: int):
    """Rank 0 of two, its board open, after `calls` agreed allreduces of float32[5000] (sum)."""
    from paraflow.reliability.check_exchange import _call_facts

    _, key, _, _, spec = _call_facts("allreduce", torch.float32, torch.Size([5000]), "sum", None, "t.py:1", True)
    backend = fake_backend(0)
    backend._check_board, backend._agreed_run, backend._traced = board, (key, spec, calls), False
    return backend


def test_the_repeated_call_takes_the_short_path_and_keeps_the_check():
    from paraflow.reliability.check_bundle import BUNDLE_AFTER
    from paraflow.reliability.check_exchange import repeat_on_board

    b0, b1 = boards()
    mine = torch.ones(5000)
    backend = repeating_backend(b0, BUNDLE_AFTER)
    start = backend._start_allreduce

    def call(sequence, tensor=mine, op="sum"):
        starts = lambda work: start(work, op)  # noqa: E731
        return repeat_on_board(backend, sequence, "allreduce", tensor, lambda: tensor, starts, "t.py:2", op)

    b1.post(21, words(21))
    assert call(21) is mine and backend._agreed_run[2] == BUNDLE_AFTER + 1  # one more agreement
    assert call(22, torch.ones(6000)) is None  # another call: exchange() decides
    assert call(22, op="max") is None
    backend._agreed_run = (*backend._agreed_run[:2], BUNDLE_AFTER - 1)
    assert call(22) is None  # not yet repeated often enough
    backend._agreed_run = (*backend._agreed_run[:2], BUNDLE_AFTER)
    backend._traced = True
    assert call(22) is None  # PARAFLOW_DEBUG: every descriptor is traced by exchange()
    backend._traced = False
    b1.post(22, words(22, collective="broadcast"))
    with pytest.raises(CollectiveError, match="ranks called different collectives"):
        call(22)
    assert backend._agreed_run is None  # after a mismatch nothing agreed before takes a short path
    assert call(23) is None
