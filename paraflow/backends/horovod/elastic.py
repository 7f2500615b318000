"""Horovod Elastic under paraflow: the survivors of a lost worker start horovod again in process.

``horovodrun --min-np/--max-np --host-discovery-script`` (its elastic mode, gloo controller) keeps
the surviving workers running when one is lost: their collective fails with horovod's
``HorovodInternalError``; they shut horovod down and start it again (``hvd.shutdown(); hvd.init()``,
as ``hvd.elastic.run`` does), which meets the driver's new rendezvous at the new size. Added or
removed hosts reach every worker through horovod's notification service, whose listener is
`paraflow.elastic.State` (``on_hosts_updated``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ...errors import CollectiveTimeoutError, ParaflowError
from ...reliability.translation import is_timeout

__all__ = ["HorovodRecovery"]


class HorovodRecovery:
    """The in-process recovery of a horovod backend started by horovodrun's elastic mode."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def listen(self, state: Any) -> None:
        """Send horovod's notices of added or removed hosts to `state`."""
        from horovod.common.elastic import notification_manager

        notification_manager.init()
        notification_manager.register_listener(state)

    def forget(self, state: Any) -> None:
        """Stop sending notices to `state`."""
        from horovod.common.elastic import notification_manager

        notification_manager.remove_listener(state)

    def lost_peer(self, exc: BaseException) -> bool:
        """Whether `exc` (or its cause) is horovod's report that a peer left the job.

        A timeout is not: the silent peer (stopped, not dead) is still a member to the driver, so
        a new rendezvous would wait for it; the timeout error ends this worker instead, after the
        stall report named the silent one.
        """
        from horovod.common.exceptions import HorovodInternalError

        seen, internal = set(), False
        while exc is not None and id(exc) not in seen:
            if isinstance(exc, CollectiveTimeoutError) or (not isinstance(exc, ParaflowError) and is_timeout(exc)):
                return False
            internal = internal or isinstance(exc, HorovodInternalError)
            seen.add(id(exc))
            exc = exc.__cause__ or exc.__context__
        return internal

    def reset(self) -> None:
        """Start horovod again at the new membership and take this process's new place in it."""
        backend = self.backend
        hvd = backend._hvd
        hvd.shutdown()
        hvd.init()
        backend._stuck = False
        backend.env = dataclasses.replace(
            backend.env,
            rank=hvd.rank(),
            world_size=hvd.size(),
            local_rank=hvd.local_rank(),
            local_world_size=hvd.local_size(),
        )
        backend._restart_stall_watch()
