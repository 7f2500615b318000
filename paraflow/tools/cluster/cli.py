"""`paraflow cluster up|exec|down|status`: an emulated multi-host cluster from the shell."""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..flags import deprecated_alias
from .cluster import IFNAME, Cluster, cluster_names, exec_argv
from .netns import ClusterError

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The cluster subcommands, under `parser`."""
    sub = parser.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="create hosts node0..nodeN-1 as network namespaces joined by a switch")
    up.add_argument("--nodes", type=int, default=2, metavar="N", help="number of hosts, node0..nodeN-1 (default 2)")
    deprecated_alias(up, "--hosts", "--nodes")
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
