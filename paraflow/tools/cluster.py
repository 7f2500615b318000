"""An emulated cluster on one machine: N hosts as network namespaces joined by one switch.

Each host ``nodeI`` is a namespace ``pf-NAME-nodeI`` with one interface, ``eth0``, at
``198.18.0.(I+1)/24`` (the benchmarking range, RFC 2544), and its own host name and hosts file;
its link runs to a bridge in a namespace of its own (``pf-NAME-switch``), which has no address and
no route, so nothing in the cluster reaches anything outside it. A bandwidth limit applies to
each host's link in both directions. Everything the cluster makes carries the prefix
``pf-NAME-``; :meth:`Cluster.down` removes all of it, and :func:`remove_stale` the clusters that
processes now dead left behind.

Launchers reach another host through an ``ssh`` stand-in (:meth:`Cluster.ssh_agent`): Open MPI
runs its rsh agent as ``AGENT HOST COMMAND...`` and horovodrun runs ``ssh -o ... HOST COMMAND``;
both hand the remote shell one command line. The stand-in does what sshd does with it: a fresh
login environment (no variable of the caller leaks through, so the launcher's own forwarding,
``mpirun -x`` or horovodrun's exports, is what a rank gets), the host's name, and ``sh -c`` of
the joined arguments, in the host's network namespace.

A command on a host (:func:`exec_argv`, ``paraflow cluster exec``) runs inside its namespace under
its host name (a UTS namespace of its own, through ``unshare --uts``), with the caller's
environment and working directory: like a shell on that host. A job (:class:`ClusterJob`) is the
:class:`~paraflow.tools.launch.HostCommand` list for a launcher, started together, waited for
with one deadline, and on timeout killed with every process left in the cluster's namespaces.

``paraflow cluster up|exec|down|status`` (:func:`add_arguments`, :func:`main`) drive it from the
shell. The namespaces, links and shaping are made by the real ``ip`` and ``tc``
(:func:`run`): every failure becomes a :class:`ClusterError` with the command and its message, so
a half-built cluster is never mistaken for a working one.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

from ..errors import ParaflowError
from .flags import renamed
from .launch import HostCommand, LaunchResult, host_commands, kill_tree, start_group

__all__ = [
    "Cluster",
    "ClusterError",
    "ClusterJob",
    "Host",
    "IFNAME",
    "SUBNET",
    "STATE_ROOT",
    "add_arguments",
    "cluster_commands",
    "cluster_names",
    "exec_argv",
    "format_rate",
    "main",
    "namespaces",
    "owned_name",
    "parse_rate",
    "remove_stale",
    "support_problem",
]


# ---------------------------------------------------------------- ip and tc
class ClusterError(ParaflowError, RuntimeError):
    """The emulated cluster could not be built, used or taken down."""


def support_problem() -> Optional[str]:
    """None when this machine can build an emulated cluster, else why not (for skips and errors)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root (network namespaces): run as root or with sudo"
    tools = (("ip", "iproute2"), ("tc", "iproute2"), ("sysctl", "procps"), ("unshare", "util-linux"))
    for tool, package in (*tools, ("hostname", "hostname")):
        if shutil.which(tool) is None:
            return f"`{tool}` is missing: apt-get install {package}"
    probe = f"pfprobe{os.getpid()}"
    try:
        run(["ip", "netns", "add", probe])
    except ClusterError as exc:
        return f"`ip netns add` does not work here ({exc})"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def run(argv: list, namespace: Optional[str] = None, check: bool = True) -> str:
    """Run `argv` (inside `namespace` when given, through `ip netns exec`); return its stdout."""
    full = ["ip", "netns", "exec", namespace, *argv] if namespace else list(argv)
    result = subprocess.run([str(a) for a in full], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise ClusterError(f"`{' '.join(map(str, full))}` failed: {result.stderr.strip() or result.returncode}")
    return result.stdout


def namespaces() -> list[str]:
    """Names of every network namespace `ip netns` knows."""
    return [line.split()[0] for line in run(["ip", "netns", "list"]).splitlines() if line.strip()]


def namespace_pids(name: str) -> list[int]:
    """Processes whose network namespace is `name`."""
    return [int(p) for p in run(["ip", "netns", "pids", name], check=False).split()]


def kill_namespace_processes(name: str, wait_s: float = 10.0) -> None:
    """SIGKILL every process in namespace `name` until none is left."""
    deadline = time.monotonic() + wait_s
    while True:
        pids = namespace_pids(name)
        if not pids:
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"processes {pids} in namespace {name} survived SIGKILL for {wait_s:g} s")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


_RATE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)bit", re.IGNORECASE)
_SCALE = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_rate(text: str) -> int:
    """Bits per second from tc's notation: ``100mbit``, ``1gbit``, ``10gbit`` (powers of 1000)."""
    match = _RATE.fullmatch(str(text).strip())
    if not match or float(match.group(1)) <= 0:
        raise ClusterError(
            f"bandwidth {text!r} is not a rate tc understands in bits per second; "
            "write it like 100mbit, 1gbit or 10gbit (paraflow cluster up --bandwidth 1gbit)."
        )
    return int(float(match.group(1)) * _SCALE[match.group(2).lower()])


def format_rate(bits_per_s: int) -> str:
    """The shortest tc notation for a rate: 1000000000 -> ``1gbit``."""
    for unit, scale in (("t", 10**12), ("g", 10**9), ("m", 10**6), ("k", 10**3)):
        if bits_per_s % scale == 0:
            return f"{bits_per_s // scale}{unit}bit"
    return f"{bits_per_s}bit"


def shape(namespace: str, device: str, bits_per_s: Optional[int]) -> None:
    """Limit `device`'s egress to `bits_per_s` with a token bucket (tbf); None removes the limit.

    The bucket holds 2 ms of traffic (at least 256 KiB, so segmentation offload's 64 KiB packets
    pass whole) and queues up to 50 ms before dropping, like a switch port's buffer.
    """
    if bits_per_s is None:
        run(["tc", "qdisc", "del", "dev", device, "root"], namespace, check=False)
        return
    burst = max(256 * 1024, bits_per_s // 8 // 500)
    run(
        ["tc", "qdisc", "replace", "dev", device, "root", "tbf"]
        + ["rate", f"{bits_per_s}bit", "burst", str(burst), "latency", "50ms"],
        namespace,
    )


# ---------------------------------------------------------------- the cluster
#: Every address the cluster hands out lies in this range (RFC 2544 benchmarking), no other.
SUBNET = ipaddress.ip_network("198.18.0.0/15")
_HOST_NET = ipaddress.ip_network("198.18.0.0/24")
#: The one interface every host has, as on a real cluster: GLOO_SOCKET_IFNAME, btl_tcp_if_include.
IFNAME = "eth0"
#: Where each cluster keeps its description and its ssh stand-in.
STATE_ROOT = "/run/paraflow-cluster"
_PREFIX = "pf-"
_NAME = re.compile(r"[a-z0-9]{1,24}")
_NETNS_ETC = "/etc/netns"  # `ip netns exec NS` mounts /etc/netns/NS/hosts over /etc/hosts
#: The PATH sshd gives a login on Debian; what every remote command starts with.
LOGIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_SSH_AGENT = """#!/bin/sh
# ssh stand-in for the emulated cluster {cluster}: runs the command inside the host's network
# namespace, under the host's name, in a fresh login environment. Written by `paraflow cluster up`.
host=
while [ $# -gt 0 ]; do
  case "$1" in
    -[BbcDEeFIiJLlmOopQRSWw]) shift 2 ;;
    -*) shift ;;
    *) if [ -z "$host" ]; then host=$1; shift; else break; fi ;;
  esac
done
host=${{host#*@}}
case "$host" in
{table}
  *) echo "ssh: Could not resolve hostname $host: not a host of the emulated cluster {cluster}" >&2; exit 255 ;;
esac
if [ $# -eq 0 ]; then
  echo "ssh: the emulated cluster runs commands only; use: paraflow cluster exec $name -- COMMAND" >&2
  exit 255
fi
exec ip netns exec "$ns" unshare --uts env -i HOME="${{HOME:-/root}}" USER="${{USER:-root}}" \\
  LOGNAME="${{LOGNAME:-root}}" SHELL=/bin/sh LANG="${{LANG:-C.UTF-8}}" PATH={path} \\
  sh -c 'hostname "$0" && exec sh -c "$1"' "$name" "$*"
"""


@dataclass(frozen=True)
class Host:
    """One emulated host: its name, its address on the cluster network, its namespace."""

    name: str
    address: str
    namespace: str


class Cluster:
    """N hosts joined by a switch, optionally with a bandwidth limit per host link.

    Args:
        name: lower-case letters and digits; names every namespace ``pf-NAME-...``.
        hosts: number of hosts (1 to 250).
        bandwidth: each host link's rate in tc notation (``1gbit``), or None for no limit.
        tcp_retries2: the hosts' ``net.ipv4.tcp_retries2``: retransmissions before TCP gives up on
            a peer that stopped answering. 5 (about 13 s) by default, as high-availability setups
            use; Linux's 15 (about 15 minutes) leaves torchrun's agent and mpirun on a host cut off
            from the others blocked that long.
    """

    def __init__(
        self, name: str = "cluster", hosts: int = 2, bandwidth: Optional[str] = None, tcp_retries2: int = 5
    ) -> None:
        if not _NAME.fullmatch(name):
            raise ClusterError(f"cluster name {name!r} must be 1-24 lower-case letters or digits (e.g. --name c1).")
        if not 1 <= hosts <= 250:
            raise ClusterError(f"an emulated cluster has 1 to 250 hosts, not {hosts}.")
        if not 1 <= tcp_retries2 <= 30:
            raise ClusterError(f"--tcp-retries2 {tcp_retries2}: choose 1 to 30 (Linux's default is 15).")
        self.name = name
        self.tcp_retries2 = tcp_retries2
        self.bits_per_s = parse_rate(bandwidth) if bandwidth else None
        self.hosts = [
            Host(f"node{i}", str(_HOST_NET.network_address + i + 1), f"{self.prefix}node{i}") for i in range(hosts)
        ]

    # ---------------------------------------------------------------- names and files
    @property
    def prefix(self) -> str:
        """What every namespace of this cluster starts with."""
        return f"{_PREFIX}{self.name}-"

    @property
    def switch(self) -> str:
        """The namespace holding the bridge."""
        return f"{self.prefix}switch"

    @property
    def state_dir(self) -> str:
        """This cluster's description (cluster.json) and its ssh stand-in (bin/ssh)."""
        return os.path.join(STATE_ROOT, self.name)

    @property
    def ssh_agent(self) -> str:
        """The `ssh` stand-in: Open MPI's plm_rsh_agent, and first on horovodrun's PATH."""
        return os.path.join(self.state_dir, "bin", "ssh")

    @property
    def bandwidth(self) -> Optional[str]:
        """Each host link's rate in tc notation, or None."""
        return format_rate(self.bits_per_s) if self.bits_per_s else None

    def host(self, name: str) -> Host:
        """The host called `name` (``node1``), or its address."""
        for host in self.hosts:
            if name in (host.name, host.address):
                return host
        known = ", ".join(h.name for h in self.hosts)
        raise ClusterError(f"cluster {self.name} has no host {name!r}; its hosts are {known}.")

    def exists(self) -> bool:
        """True when any namespace of this cluster is present."""
        return any(ns.startswith(self.prefix) for ns in namespaces())

    # ---------------------------------------------------------------- life cycle
    def up(self) -> Cluster:
        """Build the switch, the hosts and their links; on any failure remove what was built."""
        problem = support_problem()
        if problem:
            raise ClusterError(f"cannot build an emulated cluster here: {problem}")
        if self.exists():
            raise ClusterError(
                f"cluster {self.name} is already up (namespaces {self.prefix}*); "
                f"take it down first: paraflow cluster down --name {self.name}"
            )
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def _build(self) -> None:
        sw = self.switch
        run(["ip", "netns", "add", sw])
        run(["ip", "-n", sw, "link", "set", "lo", "up"])
        run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
        run(["ip", "-n", sw, "link", "set", "br0", "up"])
        hosts_file = "127.0.0.1 localhost\n::1 localhost\n" + "".join(f"{h.address} {h.name}\n" for h in self.hosts)
        for i, host in enumerate(self.hosts):
            run(["ip", "netns", "add", host.namespace])
            port = f"port{i}"
            run(["ip", "link", "add", IFNAME, "netns", host.namespace, "type", "veth", "peer", port, "netns", sw])
            run(["ip", "-n", sw, "link", "set", port, "master", "br0", "up"])
            run(["ip", "-n", host.namespace, "addr", "add", f"{host.address}/{_HOST_NET.prefixlen}", "dev", IFNAME])
            run(["ip", "-n", host.namespace, "link", "set", IFNAME, "up"])
            run(["ip", "-n", host.namespace, "link", "set", "lo", "up"])
            run(["sysctl", "-qw", f"net.ipv4.tcp_retries2={self.tcp_retries2}"], host.namespace)
            etc = os.path.join(_NETNS_ETC, host.namespace)
            os.makedirs(etc, exist_ok=True)
            with open(os.path.join(etc, "hosts"), "w") as f:
                f.write(hosts_file)
        table = "\n".join(
            "  {0}|{1}) ns={2} name={0} ;;".format(*map(shlex.quote, (h.name, h.address, h.namespace)))
            for h in self.hosts
        )
        os.makedirs(os.path.dirname(self.ssh_agent), exist_ok=True)
        with open(self.ssh_agent, "w") as f:
            f.write(_SSH_AGENT.format(cluster=self.name, table=table, path=shlex.quote(LOGIN_PATH)))
        os.chmod(self.ssh_agent, 0o755)
        self.set_bandwidth(self.bandwidth)  # shapes the links and writes cluster.json in the state_dir

    def set_bandwidth(self, bandwidth: Optional[str]) -> None:
        """Limit every host link, both directions, to `bandwidth` (tc notation); None lifts the limit."""
        self.bits_per_s = parse_rate(bandwidth) if bandwidth else None
        for i, host in enumerate(self.hosts):
            shape(host.namespace, IFNAME, self.bits_per_s)  # host -> switch
            shape(self.switch, f"port{i}", self.bits_per_s)  # switch -> host
        if os.path.isdir(self.state_dir):
            with open(os.path.join(self.state_dir, "cluster.json"), "w") as f:
                json.dump(self.describe(), f, indent=1)

    def set_link(self, host: str, up: bool) -> None:
        """Take `host`'s interface down (its cable pulled) or bring it back up."""
        run(["ip", "-n", self.host(host).namespace, "link", "set", IFNAME, "up" if up else "down"])

    def processes(self) -> dict[str, list[int]]:
        """The processes running in each namespace of this cluster that has any."""
        found = {ns: namespace_pids(ns) for ns in namespaces() if ns.startswith(self.prefix)}
        return {ns: pids for ns, pids in found.items() if pids}

    def down(self) -> list[str]:
        """Kill every process in the cluster, remove its namespaces (links and bridge go with them),
        hosts files and state; return the namespaces removed. Safe to repeat."""
        removed = []
        for ns in namespaces():
            if ns.startswith(self.prefix):
                kill_namespace_processes(ns)
                run(["ip", "netns", "del", ns])
                removed.append(ns)
        if os.path.isdir(_NETNS_ETC):
            for entry in os.listdir(_NETNS_ETC):
                if entry.startswith(self.prefix):
                    shutil.rmtree(os.path.join(_NETNS_ETC, entry), ignore_errors=True)
            if not os.listdir(_NETNS_ETC):
                os.rmdir(_NETNS_ETC)
        shutil.rmtree(self.state_dir, ignore_errors=True)
        if os.path.isdir(STATE_ROOT) and not os.listdir(STATE_ROOT):
            os.rmdir(STATE_ROOT)
        return removed

    def describe(self) -> dict:
        """What `paraflow cluster status` prints and cluster.json holds."""
        return {
            "name": self.name,
            "interface": IFNAME,
            "bandwidth": self.bandwidth,
            "tcp_retries2": self.tcp_retries2,
            "switch": self.switch,
            "ssh_agent": self.ssh_agent,
            "hosts": [vars(h) for h in self.hosts],
        }

    @classmethod
    def load(cls, name: str = "cluster") -> Cluster:
        """The cluster `paraflow cluster up --name NAME` built, from its cluster.json."""
        path = os.path.join(STATE_ROOT, name, "cluster.json")
        try:
            with open(path) as f:
                state = json.load(f)
        except OSError:
            raise ClusterError(
                f"no cluster named {name!r} is up (no {path}); start one: paraflow cluster up --name {name}"
            ) from None
        return cls(name, len(state["hosts"]), state.get("bandwidth"), state.get("tcp_retries2", 5))


def cluster_names() -> list[str]:
    """Names of the clusters whose namespaces exist now."""
    found = {ns[len(_PREFIX) :].split("-")[0] for ns in namespaces() if ns.startswith(_PREFIX)}
    return sorted(n for n in found if _NAME.fullmatch(n))


def owned_name(family: str, pid: Optional[int] = None, tag: str = "") -> str:
    """A cluster name tied to a process, ``FAMILY<pid>TAG`` (tag: letters), so that
    :func:`remove_stale` can tell when its owner is gone."""
    return f"{family}{pid or os.getpid()}{tag}"


def remove_stale(family: str) -> list[str]:
    """Take down the clusters named ``FAMILY<pid>[TAG]`` whose process no longer runs; return their names.

    Only that family is touched: other clusters, and those of live processes, stay.
    """
    stale = []
    for name in cluster_names():
        match = re.fullmatch(rf"{re.escape(family)}(\d+)[a-z]*", name)
        if match and not os.path.exists(f"/proc/{match.group(1)}"):
            Cluster(name, 1).down()
            stale.append(name)
    return stale


def exec_argv(cluster: Cluster, host: str, argv: Sequence[str]) -> list[str]:
    """The command line that runs `argv` on `host` of `cluster`."""
    h = cluster.host(host)
    return ["ip", "netns", "exec", h.namespace, "unshare", "--uts"] + [
        "sh",
        "-c",
        'hostname "$0" && exec "$@"',
        h.name,
        *map(str, argv),
    ]


def cluster_commands(
    cluster: Cluster,
    launcher: str,
    script: Sequence[str],
    nproc_per_host: int = 1,
    hosts: Optional[int] = None,
    env_keys: Sequence[str] = (),
    port: int = 29400,
) -> list[HostCommand]:
    """:func:`~paraflow.tools.launch.host_commands` for the first `hosts` hosts of `cluster`
    (default all), over its interface and through its ssh stand-in."""
    names = [h.name for h in cluster.hosts[: hosts or len(cluster.hosts)]]
    return host_commands(
        launcher,
        names,
        nproc_per_host,
        script,
        port=port,
        ifname=IFNAME,
        env_keys=env_keys,
        rsh_agent=cluster.ssh_agent,
    )


class ClusterJob:
    """The commands of one job, each started on its host; output kept in temporary files.

    Args:
        cluster: the cluster to run on.
        commands: what to run where (see :func:`cluster_commands`).
        env: variables added to every command's environment (a value of None removes one).
        cwd: working directory on every host (one file system: the same path everywhere).
    """

    def __init__(
        self,
        cluster: Cluster,
        commands: Sequence[HostCommand],
        env: Optional[Mapping[str, Optional[str]]] = None,
        cwd: Optional[str] = None,
    ) -> None:
        self.cluster = cluster
        self.commands = list(commands)
        self.started = time.monotonic()
        self._procs: list[tuple[subprocess.Popen, object, object]] = []
        for command in self.commands:
            out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            argv = exec_argv(cluster, command.host, command.argv)
            proc = start_group(argv, {**(env or {}), **command.env}, cwd, stdout=out, stderr=err)
            self._procs.append((proc, out, err))

    def poll(self) -> bool:
        """True once every command has exited."""
        return all(proc.poll() is not None for proc, _, _ in self._procs)

    def wait(self, timeout: float) -> list[LaunchResult]:
        """Wait for every command (at most `timeout` s from the start); kill everything on expiry.

        Returns:
            One result per command, in order; ``timed_out`` on all of them if the deadline passed.
        """
        deadline = self.started + timeout
        timed_out = False
        for proc, _, _ in self._procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
        if timed_out:
            self.kill()
        results, elapsed = [], time.monotonic() - self.started
        for command, (proc, out, err) in zip(self.commands, self._procs):
            proc.wait()
            texts = []
            for f in (out, err):
                f.seek(0)
                texts.append(f.read())
                f.close()
            argv = exec_argv(self.cluster, command.host, command.argv)
            results.append(LaunchResult(argv, proc.returncode, texts[0], texts[1], elapsed, timed_out))
        return results

    def kill(self) -> None:
        """SIGKILL every command with what it started, and every process left in the cluster."""
        for proc, _, _ in self._procs:
            kill_tree(proc.pid)
        for ns in self.cluster.processes():
            kill_namespace_processes(ns)


# ---------------------------------------------------------------- paraflow cluster
def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The cluster subcommands, under `parser`."""
    sub = parser.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="create hosts node0..nodeN-1 as network namespaces joined by a switch")
    up.add_argument("--nodes", type=int, default=2, metavar="N", help="number of hosts, node0..nodeN-1 (default 2)")
    renamed(up, "--hosts", use="--nodes")
    up.add_argument("--bandwidth", default=None, help="rate of each host link, both directions (1gbit, 100mbit)")
    up.add_argument(
        "--tcp-retries2",
        type=int,
        default=5,
        help="hosts' net.ipv4.tcp_retries2: 5 (default) gives up on a silent peer in ~13 s, Linux's 15 in ~15 min",
    )
    run = sub.add_parser("exec", help="run a command on one host: paraflow cluster exec node1 -- hostname")
    run.add_argument("host", help="node0, node1, ... or the host's address")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="the command, after --")
    sub.add_parser("down", help="kill every process on the hosts and remove the cluster")
    status = sub.add_parser("status", help="hosts, addresses, bandwidth and processes of the cluster")
    status.add_argument("--json", action="store_true", help="print it as JSON")
    for action in sub.choices.values():
        action.add_argument("--name", default="cluster", help="cluster name (default: cluster)")
    return parser


def main(args: argparse.Namespace) -> int:
    """Run one subcommand; a ClusterError is printed as one line and exits 2."""
    try:
        return _ACTIONS[args.action](args)
    except ClusterError as exc:
        print(f"paraflow cluster {args.action}: {exc}", file=sys.stderr)
        return 2


def _up(args: argparse.Namespace) -> int:
    cluster = Cluster(args.name, args.nodes, args.bandwidth, args.tcp_retries2).up()
    link = f"links shaped to {cluster.bandwidth} each way" if cluster.bandwidth else "links unshaped"
    print(f"cluster {cluster.name}: {len(cluster.hosts)} hosts on {IFNAME}, {link}")
    for host in cluster.hosts:
        print(f"  {host.name:8s} {host.address:14s} namespace {host.namespace}")
    print(f"run on a host:      paraflow cluster exec {_flag(args)}node0 -- hostname")
    print(f"ssh stand-in:       {cluster.ssh_agent}  (mpirun --mca plm_rsh_agent, or first on PATH)")
    print(f"remove everything:  paraflow cluster down {_flag(args)}".rstrip())
    return 0


def _exec(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise ClusterError(f"no command given: paraflow cluster exec {_flag(args)}{args.host} -- hostname")
    argv = exec_argv(Cluster.load(args.name), args.host, cmd)
    sys.stdout.flush()
    os.execvp(argv[0], argv)
    return 127  # not reached


def _down(args: argparse.Namespace) -> int:
    removed = Cluster(args.name, 1).down()
    print(f"cluster {args.name}: removed {len(removed)} namespaces" + (f" ({', '.join(removed)})" if removed else ""))
    return 0


def _status(args: argparse.Namespace) -> int:
    names = cluster_names()
    if args.name not in names:
        others = f"; clusters up: {', '.join(names)}" if names else ""
        raise ClusterError(f"no cluster named {args.name!r} is up{others}. Start one: paraflow cluster up")
    cluster = Cluster.load(args.name)
    state = {**cluster.describe(), "processes": cluster.processes()}
    if args.json:
        print(json.dumps(state))
        return 0
    print(f"cluster {cluster.name}: {len(cluster.hosts)} hosts, bandwidth {cluster.bandwidth or 'unshaped'}")
    for host in cluster.hosts:
        pids = state["processes"].get(host.namespace, [])
        print(f"  {host.name:8s} {host.address:14s} {len(pids)} processes")
    return 0


def _flag(args: argparse.Namespace) -> str:
    return "" if args.name == "cluster" else f"--name {args.name} "


_ACTIONS = {"up": _up, "exec": _exec, "down": _down, "status": _status}
