"""Pin each rank's compute to cores of its own, the same way under every launcher.

mpirun could bind (``--bind-to core``) but torchrun, horovodrun and plain python cannot, so each
rank binds itself (``sched_setaffinity``): local rank i of a launch takes the i-th run of
`threads` cores of the cores the launch may use. The benchmark pins once the backend has
started, so the communication library's threads (gloo's workers and I/O loop, horovod's
background thread, MPI's), started before, stay free to run on any core, while the main thread
and the threads it starts later (torch's pool) are bound. Pinned together with their rank on
one core, gloo's threads stalled a collective for about 3 ms every few calls (a 1 MB allreduce
between two ranks: median 3.1-3.7 ms pinned that way against 0.6-0.9 ms free, 0.45-0.53 ms at
best either way). Without any pinning the scheduler moves ranks between cores and two ranks'
compute can share one core for a while, one of the ways two launches of the same cell disagree.

Pinned runs also put torch's gloo event loop (the thread `gloo_tcp_loop`) at idle priority. That
loop polls its sockets with level-triggered epoll: when bytes arrive before the receiving worker
has posted its buffer, it spins until the worker runs. With as many busy threads as cores the
worker waits for a core until the scheduler's next tick (4 ms here): a raw 4 KB allreduce
between two ranks took about 4 ms in 2-3 % of calls, and a 1 MB one over 2.4 ms in a quarter
of them (0.6 ms at idle priority). At idle priority the loop gives up its core the moment any
other thread wants it, and runs at full speed on a core nothing else wants. This is a setting
of the benchmark, not of paraflow's backends: at idle priority the loop gets almost no CPU
while other threads are runnable on every core. Horovod's own gloo (its gloo controller) is
left as it is: horovod's waits spin on the core, and its loops at idle priority starved (a
64 MB allreduce took 147 ms, against 61-62 ms as shipped).
"""

from __future__ import annotations

import os
from typing import Optional

__all__ = ["pin_rank", "cores_for", "free_threads", "idle_polling_loops", "POLLING_LOOPS"]

#: Names of communication threads that poll rather than sleep: torch's gloo TCP device loop.
POLLING_LOOPS = ("gloo_tcp_loop",)


def cores_for(local_rank: int, threads: int, allowed: list) -> list:
    """The `threads` cores local rank `local_rank` takes from `allowed` (wrapping when ranks outnumber cores)."""
    allowed = sorted(allowed)
    threads = max(1, min(threads, len(allowed)))
    start = (local_rank * threads) % len(allowed)
    return [allowed[(start + i) % len(allowed)] for i in range(threads)]


def pin_rank(threads: int, local_rank: int) -> Optional[list]:
    """Bind the calling thread (and the threads it starts from now on) to local rank `local_rank`'s
    own cores; returns them, or None where the OS cannot bind."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    chosen = cores_for(local_rank, threads, list(os.sched_getaffinity(0)))
    os.sched_setaffinity(0, chosen)
    return chosen


def free_threads(cores: list) -> Optional[int]:
    """How many of this process's threads may run outside `cores` (the communication library's,
    started before pinning); None where the OS does not say."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return None
    free = 0
    for tid in tids:
        try:
            free += not os.sched_getaffinity(tid) <= set(cores)
        except OSError:  # the thread ended meanwhile
            pass
    return free


def idle_polling_loops(names: tuple = POLLING_LOOPS) -> Optional[int]:
    """Put this process's threads called one of `names` at idle priority (SCHED_IDLE), so they
    run only on a core no other thread wants; returns how many, None where the OS cannot."""
    if not hasattr(os, "SCHED_IDLE"):
        return None
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    idled = 0
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as comm:
                if comm.read().strip() not in names:
                    continue
            os.sched_setscheduler(int(tid), os.SCHED_IDLE, os.sched_param(0))
            idled += 1
        except OSError:  # the thread ended meanwhile, or the OS refused
            pass
    return idled
