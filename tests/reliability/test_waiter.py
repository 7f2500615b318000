"""Blocking waits on a thread of their own: results, errors and the timeout reach the caller."""

import gc
import threading
import weakref

import pytest

from paraflow.reliability.deadlines import DeadlineExceeded
from paraflow.reliability.waiter import Waiter

pytestmark = pytest.mark.timeout(30)


def test_results_and_errors_come_back_in_order_on_one_thread():
    waiter = Waiter("test waiter")
    threads = []

    def where(value):
        threads.append(threading.current_thread())
        return value

    assert [waiter.run(lambda v=v: where(v), 5, "job") for v in range(3)] == [0, 1, 2]
    assert len(set(threads)) == 1 and threads[0] is not threading.current_thread()
    with pytest.raises(ValueError, match="bad tensor"):
        waiter.run(lambda: (_ for _ in ()).throw(ValueError("bad tensor")), 5, "job")


def test_a_wait_that_never_ends_raises_after_the_timeout_and_leaves_the_thread_behind():
    waiter = Waiter("test waiter")
    release = threading.Event()
    with pytest.raises(DeadlineExceeded, match="waiting for rank 1 timed out after 0.2 s"):
        waiter.run(release.wait, 0.2, "waiting for rank 1")
    release.set()  # the thread finishes the abandoned wait and takes the next one
    assert waiter.run(lambda: "next", 5, "job") == "next"


def test_close_ends_the_thread_and_a_later_wait_starts_a_new_one():
    waiter = Waiter("test waiter")
    assert waiter.run(lambda: 1, 5, "job") == 1
    thread = waiter._thread
    waiter.close()
    thread.join(5)
    assert not thread.is_alive()
    assert waiter.run(lambda: 2, 5, "job") == 2 and waiter._thread is not thread


def test_close_returns_once_an_idle_thread_has_ended():
    waiter = Waiter("test waiter")
    assert waiter.run(lambda: 1, 5, "job") == 1
    thread = waiter._thread
    waiter.close()
    assert not thread.is_alive(), "a thread alive at interpreter exit may abort the process"


def test_close_does_not_wait_for_a_stuck_wait():
    waiter = Waiter("test waiter")
    release = threading.Event()
    with pytest.raises(DeadlineExceeded):
        waiter.run(release.wait, 0.1, "waiting for rank 1")
    thread = waiter._thread
    waiter.close()
    assert thread.is_alive()
    release.set()
    thread.join(5)
    assert not thread.is_alive()


def test_the_thread_keeps_no_result_once_the_caller_has_it():
    class Result:
        pass

    waiter = Waiter("test waiter")
    result = waiter.run(Result, 5, "job")
    alive = weakref.ref(result)
    del result
    gc.collect()
    assert alive() is None, "the waiting thread still holds the result (freed there at exit, it aborts)"
    waiter.close()
