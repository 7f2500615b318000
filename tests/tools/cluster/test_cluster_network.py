"""The emulated cluster itself: names, addresses, confinement, reachability, shaped links, clean removal."""

import ipaddress
import json
import subprocess
import sys
from pathlib import Path

import pytest
from clusterkit import CLUSTER_WORKERS, build, cluster_fixture, on_host, skip_without_namespaces  # noqa: F401
from conftest import ROOT

from paraflow.tools.cluster import SUBNET, Cluster, namespaces, owned_name, parse_rate, remove_stale

pytestmark = pytest.mark.cluster
TCP = str(CLUSTER_WORKERS / "tcp.py")


def sh(cluster, host, command, timeout=30):
    result = subprocess.run(
        on_host(cluster, host, "sh", "-c", command), capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def transfer(cluster, sender, receiver, size, port=5201):
    """Send `size` bytes from `sender` to `receiver` by name; the receiver's report."""
    server = subprocess.Popen(
        on_host(cluster, receiver, sys.executable, TCP, "serve", str(port)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stderr.readline().strip() == "ready"
        subprocess.run(
            on_host(cluster, sender, sys.executable, TCP, "send", receiver, str(port), str(size)),
            check=True,
            timeout=60,
        )
        out, err = server.communicate(timeout=30)
    finally:
        server.kill()
        server.wait()
    return json.loads(out)


def test_each_host_has_its_name_and_one_address_in_the_benchmarking_range(cluster):
    for i, host in enumerate(cluster.hosts):
        assert sh(cluster, host.name, "hostname").strip() == f"node{i}"
        addresses = sh(cluster, host.name, "ip -4 -o addr show scope global | awk '{print $4}'").split()
        assert addresses == [f"{host.address}/24"]
        assert ipaddress.ip_address(host.address) in SUBNET
        # One route: the cluster's own network. No default route, nothing beyond the switch.
        assert sh(cluster, host.name, "ip -4 route").split()[0] == "198.18.0.0/24"
        assert len(sh(cluster, host.name, "ip -4 route").splitlines()) == 1
        assert f"{cluster.hosts[1 - i].address} node{1 - i}" in sh(cluster, host.name, "cat /etc/hosts")


def test_the_switch_has_no_address_and_no_route(cluster):
    assert sh_switch(cluster, "ip -4 -o addr show scope global") == ""
    assert sh_switch(cluster, "ip -4 route") == ""


def sh_switch(cluster, command):
    return subprocess.run(
        ["ip", "netns", "exec", cluster.switch, "sh", "-c", command], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_hosts_reach_each_other_by_name_both_ways(cluster):
    there = transfer(cluster, "node0", "node1", 100_000)
    back = transfer(cluster, "node1", "node0", 100_000, port=5202)
    assert there == {"bytes": 100_000, "seconds": there["seconds"], "peer": cluster.hosts[0].address}
    assert back["bytes"] == 100_000 and back["peer"] == cluster.hosts[1].address


@pytest.mark.parametrize("sender, receiver", [("node0", "node1"), ("node1", "node0")])
def test_a_shaped_link_carries_its_bandwidth_within_20_percent(cluster, sender, receiver):
    rate = parse_rate("200mbit")
    cluster.set_bandwidth("200mbit")
    try:
        report = transfer(cluster, sender, receiver, 25_000_000)  # 1 s at 200 Mbit/s
    finally:
        cluster.set_bandwidth(None)
    measured = report["bytes"] * 8 / report["seconds"]
    assert abs(measured - rate) <= 0.2 * rate, f"{measured / 1e6:.0f} Mbit/s measured on a 200mbit link"


def test_down_removes_namespaces_links_bridge_files_and_processes():
    root_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.split("\n")
    root_names = sorted(line.split(":")[1] for line in root_links if line)
    built = build("d", hosts=3, bandwidth="1gbit")
    sleeper = subprocess.Popen(on_host(built, "node2", "sleep", "600"))
    assert len([ns for ns in namespaces() if ns.startswith(built.prefix)]) == 4  # 3 hosts + the switch
    assert built.processes()
    removed = built.down()
    assert sorted(removed) == sorted([h.namespace for h in built.hosts] + [built.switch])
    assert not [ns for ns in namespaces() if ns.startswith(built.prefix)]
    assert sleeper.wait(timeout=10) != 0
    now = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.split("\n")
    assert sorted(line.split(":")[1] for line in now if line) == root_names  # nothing made outside
    assert not list(Path("/etc/netns").glob(f"{built.prefix}*"))
    assert not Path(built.state_dir).exists()
    assert built.down() == []  # repeating is harmless


def test_stale_clusters_of_dead_processes_go_and_others_stay():
    skip_without_namespaces()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    alive = build("a", hosts=1)  # named after this live process
    stale = Cluster(owned_name("t", pid=dead.pid, tag="s"), 1).up()
    try:
        assert remove_stale("t") == [stale.name]
        assert not stale.exists() and alive.exists()
    finally:
        stale.down()
        alive.down()


def test_cli_up_exec_status_down():
    skip_without_namespaces()
    name = owned_name("t", tag="c")
    cli = [sys.executable, "-m", "paraflow.cli", "cluster"]

    def paraflow(action, *args):
        argv = [*cli, action, "--name", name, *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=str(ROOT))

    up = paraflow("up", "--nodes", "2", "--bandwidth", "1gbit")
    try:
        assert up.returncode == 0, up.stderr
        assert "node1" in up.stdout and "198.18.0.2" in up.stdout
        again = paraflow("up")
        assert again.returncode == 2 and "already up" in again.stderr and f"down --name {name}" in again.stderr
        assert paraflow("exec", "node1", "--", "hostname").stdout.strip() == "node1"
        status = json.loads(paraflow("status", "--json").stdout)
        assert status["bandwidth"] == "1gbit" and [h["name"] for h in status["hosts"]] == ["node0", "node1"]
    finally:
        down = paraflow("down")
    assert down.returncode == 0 and "removed 3 namespaces" in down.stdout
    gone = paraflow("status")
    assert gone.returncode == 2 and "no cluster named" in gone.stderr
