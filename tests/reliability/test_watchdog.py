"""The watchdog acts only on a wait past its deadline; which errors make a rank wait for the launcher."""

import time

from paraflow.errors import CollectiveError, CollectiveTimeoutError
from paraflow.reliability import deadlines
from paraflow.reliability.deadlines import Watchdog
from paraflow.reliability.mpi_abort import lost_a_peer


def test_a_wait_past_its_deadline_is_reported_and_ends_the_process(capsys):
    ended = []
    dog = Watchdog(end=ended.append)
    with dog.watch(0.2, lambda waited: f"paraflow.errors.CollectiveTimeoutError: waited {waited:.1f} s"):
        deadline = time.monotonic() + 10
        while not ended and time.monotonic() < deadline:
            time.sleep(0.05)
    assert ended == [1]
    assert "paraflow.errors.CollectiveTimeoutError: waited 0." in capsys.readouterr().err


def test_waits_that_end_in_time_cost_nothing_and_leave_nothing():
    ended = []
    dog = Watchdog(end=ended.append)
    for _ in range(1000):
        with dog.watch(60, lambda waited: "never"):
            pass
    time.sleep(2 * deadlines.TICK_S)
    assert ended == [] and dog._waits == {}


def test_one_watch_bounds_one_wait_after_another():
    dog = Watchdog(end=[].append)
    watch = dog.watch(60, lambda waited: "never")
    for _ in range(3):
        with watch:
            assert len(dog._waits) == 1
    assert dog._waits == {}


def test_which_errors_mean_a_peer_was_lost():
    lost = CollectiveError("allreduce on rank 0 of 2 (backend ddp-gloo) failed: the connection to rank 1 was lost, ...")
    assert lost_a_peer(lost)
    assert lost_a_peer(RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:20100"))
    assert not lost_a_peer(CollectiveTimeoutError("allreduce ... timed out: rank 1 did not join it"))
    assert not lost_a_peer(RuntimeError("Timed out waiting 10000ms for recv operation to complete"))
    assert not lost_a_peer(ValueError("injected failure on rank 1 at step 3"))
    try:  # chained: a translation of torch's error keeps it as the cause
        try:
            raise RuntimeError("Connection reset by peer")
        except RuntimeError as exc:
            raise CollectiveError("the gradient allreduce in loss.backward() on rank 0 failed") from exc
    except CollectiveError as outer:
        assert lost_a_peer(outer)
