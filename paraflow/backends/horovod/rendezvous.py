"""Start horovod's gloo controller without horovodrun.

``horovodrun --gloo`` runs horovod's ``RendezvousServer`` and hands every rank the HOROVOD_*
variables that point at it. Under other launchers (torchrun, srun, plain python, or mpirun when
the gloo controller is asked for) rank 0 starts that same server and tells the other ranks its
port through a torch ``TCPStore``:

* under torchrun, a client of the store torchrun's agent already serves at MASTER_ADDR:MASTER_PORT;
* elsewhere, a store rank 0 serves at the address the launcher gives (see ``resolve_master``).

Every rank writes its host name to the store, rank 0 turns them into horovod's host plan, and each
rank then sets the variables ``horovodrun`` would have set before ``hvd.init()``. Rank 0 keeps the
server until every rank has shut horovod down.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket

from ...environment.launchers import ProcessEnvironment
from ...environment.rendezvous import host_address
from ...environment.scoped_env import ScopedEnv

__all__ = ["GlooRendezvous", "gloo_interface"]

_generation = 0  # rendezvous started by this process so far; keeps store keys fresh on re-init


def gloo_interface(peer: str) -> str:
    """The network interface this host uses to reach `peer` (an address or host name)."""
    import psutil  # a horovod dependency

    try:
        local_ip = _local_ip_towards(peer)
    except OSError:
        return "lo"
    if ipaddress.ip_address(local_ip).is_loopback:
        return "lo"
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == local_ip for a in addresses):
            return name
    return "lo"


def _gloo_ifname() -> str:
    """The first interface GLOO_SOCKET_IFNAME names, or ''."""
    return os.environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0]


def _local_ip_towards(peer: str) -> str:
    """The source address the kernel picks for packets to `peer` (UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(peer), 9))
        return s.getsockname()[0]


class GlooRendezvous:
    """Rank 0's horovod rendezvous server, found by the other ranks through a torch TCPStore.

    Args:
        env: this process's place in the job.
        store_addr: host of the TCPStore the ranks meet at.
        store_port: its port.
        serve_store: rank 0 serves the store (False: a launcher such as torchrun already does).
        timeout: seconds to wait for the other ranks.
    """

    def __init__(
        self, env: ProcessEnvironment, store_addr: str, store_port: int, *, serve_store: bool, timeout: float
    ) -> None:
        self.env = env
        self.store_addr = store_addr
        self.store_port = store_port
        self.serve_store = serve_store
        self.timeout = timeout
        self.variables: dict[str, str] = {}
        self._store = None
        self._server = None
        self._env_vars = ScopedEnv()

    @property
    def single_host(self) -> bool:
        """True when every rank runs on this host."""
        return self.env.local_world_size == self.env.world_size

    def start(self) -> dict[str, str]:
        """Meet the other ranks, start the server on rank 0, and set this rank's HOROVOD_* variables.

        Returns:
            The variables set in ``os.environ`` (restored by :meth:`close`).
        """
        from horovod.runner.common.util.hosts import HostInfo, get_host_assignments

        global _generation
        _generation += 1
        env = self.env
        store = self._store = self._connect(_generation)
        hostname = socket.gethostname()
        store.set(f"host/{env.rank}", hostname)
        hosts = self._gather_hosts(store)
        if env.rank == 0:
            plan = get_host_assignments([HostInfo(h, hosts.count(h)) for h in dict.fromkeys(hosts)], env.world_size)
            from horovod.runner.http.http_server import RendezvousServer

            self._server = RendezvousServer()
            port = self._server.start()
            self._server.init(plan)
            addr = "127.0.0.1" if self.single_host else host_address(socket.getfqdn)
            store.set("server", f"{addr}:{port}")
        else:
            store.wait(["server"])
        addr, _, port = store.get("server").decode().rpartition(":")
        slot = self._slot(hosts, hostname)
        self.variables = {
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": addr,
            "HOROVOD_GLOO_RENDEZVOUS_PORT": port,
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": os.environ.get("HOROVOD_CPU_OPERATIONS", "gloo"),
            "HOROVOD_GLOO_IFACE": os.environ.get("HOROVOD_GLOO_IFACE")
            or ("lo" if self.single_host else _gloo_ifname() or gloo_interface(addr)),
            "HOROVOD_HOSTNAME": hostname,
            "HOROVOD_RANK": str(env.rank),
            "HOROVOD_SIZE": str(env.world_size),
            "HOROVOD_LOCAL_RANK": str(slot[0]),
            "HOROVOD_LOCAL_SIZE": str(slot[1]),
            "HOROVOD_CROSS_RANK": str(slot[2]),
            "HOROVOD_CROSS_SIZE": str(slot[3]),
        }
        self._env_vars.set(self.variables)
        return self.variables

    def close(self) -> None:
        """After ``hvd.shutdown()``: rank 0 waits for every rank to finish, then stops the server."""
        store, self._store = self._store, None
        try:
            if store is not None:
                if self.env.rank == 0:
                    keys = [f"done/{r}" for r in range(1, self.env.world_size)]
                    if keys:
                        try:
                            store.wait(keys, datetime.timedelta(seconds=min(self.timeout, 60)))
                        except Exception:  # a rank that died; nothing left to keep alive for it
                            pass
                else:
                    store.set(f"done/{self.env.rank}", "1")
        finally:
            if self._server is not None:
                self._server.stop()
                self._server = None
            self._env_vars.restore()

    # ---------------------------------------------------------------- helpers
    def _connect(self, generation: int):
        import torch.distributed as dist

        is_server = self.serve_store and self.env.rank == 0
        store = dist.TCPStore(
            self.store_addr,
            self.store_port,
            self.env.world_size,
            is_server,
            timeout=datetime.timedelta(seconds=self.timeout),
            wait_for_workers=False,
        )
        run = os.environ.get("TORCHELASTIC_RUN_ID", "run")
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        return dist.PrefixStore(f"paraflow/horovod/{run}/{restart}/{generation}/", store)

    def _gather_hosts(self, store) -> list[str]:
        keys = [f"host/{r}" for r in range(self.env.world_size)]
        store.wait(keys)
        return [store.get(k).decode() for k in keys]

    def _slot(self, hosts: list[str], hostname: str) -> tuple[int, int, int, int]:
        """(local rank, local size, cross rank, cross size) of this rank in horovod's terms."""
        local_rank = self.env.local_rank
        order = list(dict.fromkeys(hosts))
        counts = {h: hosts.count(h) for h in order}
        # Hosts with a process at this local rank, in plan order: that is horovod's cross group.
        cross = [h for h in order if counts[h] > local_rank]
        return local_rank, counts[hostname], cross.index(hostname), len(cross)
