"""Unit tests, no processes: error translation and the collective descriptor."""

import subprocess
import sys
import time

import pytest
import torch

from paraflow.backends.ddp.backend import unused_parameters_error
from paraflow.core.collectives import fold
from paraflow.errors import CollectiveError, CollectiveTimeoutError, ConfigurationError, LauncherError
from paraflow.reliability.collective_check import (
    _call,
    _decode,
    _encode,
    _mismatch,
    decode_calls,
    describe,
    encode_calls,
    recorded_mismatch_error,
)
from paraflow.reliability.deadlines import DeadlineExceeded, call_with_deadline, spin_until
from paraflow.reliability.translation import startup_errors, translate_collective_error

GLOO_TIMEOUT = RuntimeError(
    "[../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 10000ms for recv operation to complete"
)
GLOO_CLOSED = RuntimeError("[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:5123.")
HOROVOD_DOWN = RuntimeError("Horovod has been shut down. This was caused by an exception on one of the ranks")


def translate(exc, rank=0, world_size=2):
    return translate_collective_error(
        exc, collective="allreduce", rank=rank, world_size=world_size, backend="ddp-gloo", timeout=10
    )


def test_timeout_becomes_collective_timeout_naming_collective_rank_and_peer():
    err = translate(GLOO_TIMEOUT)
    assert isinstance(err, CollectiveTimeoutError) and isinstance(err, TimeoutError)
    text = str(err)
    assert "allreduce on rank 0 of 2" in text and "rank 1 did not join" in text and "10 s" in text
    assert "Timed out waiting 10000ms" in text  # the original stays visible


@pytest.mark.parametrize("exc", [GLOO_CLOSED, HOROVOD_DOWN])
def test_lost_peer_becomes_collective_error(exc):
    err = translate(exc, rank=1)
    assert type(err) is CollectiveError
    assert "allreduce on rank 1 of 2" in str(err) and "connection to rank 0 was lost" in str(err)


def test_peer_is_not_guessed_with_more_than_two_ranks():
    assert "another rank" in str(translate(GLOO_TIMEOUT, world_size=3))


@pytest.mark.parametrize(
    "exc", [RuntimeError("CUDA out of memory"), ValueError("timed out"), CollectiveError("already ours, timed out")]
)
def test_other_errors_are_left_alone(exc):
    assert translate(exc) is None


def test_taken_port_names_address_and_port():
    raw = RuntimeError(
        "The server socket has failed to listen on any local network address. port: 29500, "
        "useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"
    )
    with pytest.raises(LauncherError, match=r"127\.0\.0\.1:29500.*already in use") as info:
        with startup_errors(rank=0, world_size=2, address="127.0.0.1", port=29500, timeout=10, launcher="openmpi"):
            raise raw
    assert info.value.__cause__ is raw


def test_missing_ranks_name_the_world_size_and_the_count():
    raw = RuntimeError("Timed out after 11 seconds waiting for clients. 2/3 clients joined.")
    with pytest.raises(LauncherError, match=r"job has 3 processes, but only 2 of 3 joined.*127\.0\.0\.1:1234"):
        with startup_errors(rank=0, world_size=3, address="127.0.0.1", port=1234, timeout=10, launcher="torchrun"):
            raise raw


def test_call_with_deadline_returns_raises_or_gives_up():
    assert call_with_deadline(lambda: 7, 5, "adding") == 7
    with pytest.raises(KeyError):
        call_with_deadline(lambda: {}["x"], 5, "looking up")
    import threading

    never = threading.Event()
    with pytest.raises(RuntimeError, match="waiting timed out after 0.2 s"):
        call_with_deadline(never.wait, 0.2, "waiting")
    never.set()


def test_spin_until_returns_once_another_threads_work_is_done_and_gives_up_at_the_deadline():
    """The wait polls on the calling thread: work another thread finishes ends it; work that
    never finishes raises at the deadline, having been polled throughout."""
    import threading

    finished = threading.Event()
    worker = threading.Thread(target=lambda: [sum(range(1000)) for _ in range(200)] and finished.set())
    started = time.monotonic()
    worker.start()
    spin_until(finished.is_set, 10, "summing")
    worker.join()
    assert finished.is_set() and time.monotonic() - started < 5
    polls = []
    with pytest.raises(DeadlineExceeded, match="waiting timed out after 0.2 s"):
        spin_until(lambda: polls.append(1) and False, 0.2, "waiting")
    assert len(polls) > 100  # polled throughout, not once


def test_unused_parameters_are_named_from_torch_indices():
    module = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    raw = RuntimeError(
        "... pass the keyword argument `find_unused_parameters=True` to DDP ...\n"
        "Parameter indices which did not receive grad for rank 1: 2 3\n In addition, ..."
    )
    err = unused_parameters_error(raw, module, 1, "paraflow.init('ddp', find_unused_parameters=True)")
    assert isinstance(err, ConfigurationError)
    assert "1.weight, 1.bias" in str(err) and "find_unused_parameters=True" in str(err) and "Horovod" in str(err)
    assert unused_parameters_error(RuntimeError("other"), module, 1, "") is None


def _descriptor(collective="allreduce", sequence=1, tensor=None, argument=0, site="train.py:10"):
    tensor = torch.ones(3) if tensor is None and collective != "barrier" else tensor
    argument = ("sum", "mean", "min", "max")[argument] if collective == "allreduce" else argument
    row = _encode(_call(collective, sequence, tensor, argument, site))
    assert row.dtype == torch.uint8 and row.numel() == 512
    return _decode(row)


def test_descriptor_round_trip():
    d = _descriptor(tensor=torch.zeros(2, 3, dtype=torch.float64), argument=3, sequence=42)
    assert str(d) == "allreduce(float64[2, 3], op=max) as collective #42 at train.py:10"
    assert str(_descriptor("barrier")) == "barrier() as collective #1 at train.py:10"
    assert str(_descriptor("broadcast", argument=1)) == "broadcast(float32[3], src=1) as collective #1 at train.py:10"


@pytest.mark.parametrize(
    "other, problem",
    [
        (dict(tensor=torch.ones(4)), "shape differs"),
        (dict(tensor=torch.ones(3, 1)), "shape differs"),
        (dict(tensor=torch.ones(3, dtype=torch.int32)), "dtype differs"),
        (dict(collective="broadcast"), "different collectives"),
        (dict(sequence=2), "different numbers of paraflow collectives"),
        (dict(argument=1), "different arguments"),
    ],
)
def test_every_kind_of_mismatch_is_found(other, problem):
    mine, theirs = _descriptor(), _descriptor(**other)
    assert problem in _mismatch([mine, theirs])
    assert _mismatch([mine, _descriptor()]) is None


def test_garbage_is_not_a_descriptor():
    garbage = _decode(torch.full((512,), 7, dtype=torch.uint8))
    assert _mismatch([_descriptor(), garbage]) == "a rank is inside a different collective"
    assert "rank 1 called something that is not a paraflow collective" in describe([_descriptor(), garbage])


def test_describe_groups_ranks_with_the_same_call():
    a, b = _descriptor(), _descriptor(tensor=torch.ones(4))
    text = describe([a, a, b])
    assert text.startswith("ranks 0, 1 called allreduce(float32[3]") and "rank 2 called allreduce(float32[4]" in text


def test_horovod_shut_down_after_the_whole_timeout_counts_as_a_timeout():
    err = translate_collective_error(
        HOROVOD_DOWN, collective="allreduce", rank=0, world_size=2, backend="horovod", timeout=10, waited=10.5
    )
    assert isinstance(err, CollectiveTimeoutError) and err.original is HOROVOD_DOWN


def test_an_inner_translation_is_renamed_after_the_users_collective():
    from types import SimpleNamespace

    from paraflow.reliability.translation import collective_errors

    backend = SimpleNamespace(rank=1, world_size=2, name="horovod", timeout=10)
    inner = translate(GLOO_TIMEOUT)  # what a backend's own step raised, named after that step
    with pytest.raises(CollectiveTimeoutError, match=r"^broadcast on rank 1 of 2") as info:
        with collective_errors(backend, "broadcast"):
            raise inner
    assert info.value.__cause__ is GLOO_TIMEOUT


def test_spin_until_sleeping_returns_when_done_and_fails_after_the_deadline():
    calls = iter([False, False, True])
    spin_until(lambda: next(calls), 5, "polling", sleep=True)
    with pytest.raises(RuntimeError, match="polling timed out after 0.05 s"):
        spin_until(lambda: False, 0.05, "polling", sleep=True)


_FOLD_CALLS = """
import torch
from paraflow.core.collectives import fold
digest = 0
for call in [("allreduce", torch.float32, torch.Size([3]), "sum"), ("barrier", None, (), None),
             ("broadcast", torch.int64, torch.Size([]), 1), ("allgather", torch.bfloat16, torch.Size([2, 2]), None)]:
    digest = fold(digest, *call)
print(digest)
"""


def test_the_digest_of_the_same_calls_is_the_same_in_every_process():
    digests = {
        subprocess.run(
            [sys.executable, "-c", _FOLD_CALLS],
            env={"PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2", "random")
    }
    assert len(digests) == 1, digests


def test_the_digest_tells_every_kind_of_difference_apart():
    base = ("allreduce", torch.float32, torch.Size([3]), "sum")
    others = [
        ("broadcast", torch.float32, torch.Size([3]), "sum"),
        ("allreduce", torch.float64, torch.Size([3]), "sum"),
        ("allreduce", torch.float32, torch.Size([4]), "sum"),
        ("allreduce", torch.float32, torch.Size([3, 1]), "sum"),
        ("allreduce", torch.float32, torch.Size([3]), "max"),
    ]
    assert len({fold(0, *call) for call in [base, *others]}) == 1 + len(others)
    assert fold(fold(0, *base), *others[0]) != fold(fold(0, *others[0]), *base)


def _kept(*shapes: int) -> dict:
    records = [("allreduce", n + 1, torch.float32, torch.Size([s]), "sum", f"t.py:{n}") for n, s in enumerate(shapes)]
    return decode_calls(encode_calls(records))


def test_a_mismatch_found_later_names_the_first_differing_call_each_rank_kept():
    error = recorded_mismatch_error("at the end", [_kept(1, 2, 3), _kept(1, 5, 6)])
    assert "shape differs" in str(error)
    assert "rank 0 called allreduce(float32[2], op=sum) as collective #2 at t.py:1" in str(error)
    assert "rank 1 called allreduce(float32[5], op=sum) as collective #2" in str(error)
    named = recorded_mismatch_error("at the call", [_kept(1, 2, 3), _kept(1, 5, 6)], number=3)
    assert "rank 0 called allreduce(float32[3], op=sum) as collective #3" in str(named)


def test_a_mismatch_older_than_the_kept_calls_still_names_every_rank():
    error = recorded_mismatch_error("at the end", [_kept(1, 2), _kept(1, 2, 3)], counts=[40, 41])
    assert "rank 0 made 40 collectives" in str(error) and "rank 1 made 41 collectives" in str(error)
    assert "older than the calls each rank keeps" in str(error)


def test_kept_calls_that_do_not_fit_lose_the_oldest():
    records = [("allgather", n, torch.float32, torch.Size([n]), None, "x" * 90) for n in range(1, 200)]
    kept = decode_calls(encode_calls(records))
    assert max(kept) == 199 and min(kept) > 1 and kept[199].shape == "[199]"
