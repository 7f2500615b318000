"""Per-host command lines for each launcher, and the emulated cluster's input checks (no root needed)."""

import os

import pytest

from paraflow.errors import ConfigurationError, ParaflowError
from paraflow.tools.cluster import Cluster, ClusterError, format_rate, parse_rate, support_problem
from paraflow.tools.launch import OOB_KEEPALIVE, host_commands

HOSTS = ["n0", "n1"]
SCRIPT = ["train.py", "--backend", "ddp-gloo"]


def flag_value(argv, flag):
    return argv[argv.index(flag) + 1]


def test_torchrun_runs_one_agent_per_host_meeting_at_the_first():
    commands = host_commands("torchrun", HOSTS, 2, SCRIPT, port=29555, ifname="eth0", job_id="j1")
    assert [c.host for c in commands] == HOSTS
    for command in commands:
        argv = command.argv
        assert argv[1:3] == ["-m", "torch.distributed.run"] and argv[-3:] == SCRIPT
        assert flag_value(argv, "--nnodes") == "2" and flag_value(argv, "--nproc_per_node") == "2"
        assert flag_value(argv, "--rdzv-backend") == "c10d" and flag_value(argv, "--rdzv-endpoint") == "n0:29555"
        assert flag_value(argv, "--rdzv-id") == "j1"
        assert command.env == {"GLOO_SOCKET_IFNAME": "eth0"}
    fresh = host_commands("torchrun", HOSTS, 1, SCRIPT)
    assert flag_value(fresh[0].argv, "--rdzv-id") == flag_value(fresh[1].argv, "--rdzv-id")  # one job


def test_mpirun_runs_on_the_first_host_and_reaches_the_others_through_the_agent():
    (command,) = host_commands(
        "mpirun", HOSTS, 2, SCRIPT, ifname="eth0", env_keys=["PYTHONPATH"], rsh_agent="/x/bin/ssh"
    )
    argv = command.argv
    assert command.host == "n0" and argv[-3:] == SCRIPT
    assert flag_value(argv, "-np") == "4" and flag_value(argv, "-H") == "n0:2,n1:2"
    mca = {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "--mca"}
    assert mca["plm_rsh_agent"] == "/x/bin/ssh"
    assert mca["btl_tcp_if_include"] == mca["oob_tcp_if_include"] == "eth0"
    assert all(mca[k] == str(v) for k, v in OOB_KEEPALIVE.items())
    exported = [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]
    assert exported == ["GLOO_SOCKET_IFNAME", "PYTHONPATH"]


def test_horovodrun_runs_on_the_first_host_with_the_ssh_stand_in_first_on_path():
    (command,) = host_commands("horovodrun", HOSTS, 1, SCRIPT, ifname="eth0", rsh_agent="/x/bin/ssh")
    argv = command.argv
    assert flag_value(argv, "-np") == "2" and flag_value(argv, "-H") == "n0:1,n1:1" and "--gloo" in argv
    assert flag_value(argv, "--network-interface") == "eth0"
    assert command.env["PATH"].split(os.pathsep)[0] == "/x/bin"


def test_without_an_interface_or_agent_each_library_chooses():
    (command,) = host_commands("mpirun", HOSTS, 1, SCRIPT)
    assert "plm_rsh_agent" not in command.argv and "btl_tcp_if_include" not in command.argv
    assert command.env == {}


@pytest.mark.parametrize("args", [("srun", HOSTS, 1), ("torchrun", [], 1), ("mpirun", HOSTS, 0)])
def test_bad_requests_are_refused(args):
    with pytest.raises(ConfigurationError):
        host_commands(*args, SCRIPT)


def test_rates_in_tc_notation():
    assert parse_rate("1gbit") == 10**9 and parse_rate("100Mbit") == 10**8 and parse_rate("2.5gbit") == 25 * 10**8
    assert format_rate(10**10) == "10gbit" and format_rate(1500) == "1500bit"
    with pytest.raises(ClusterError, match="100mbit") as info:
        parse_rate("1GB/s")
    assert isinstance(info.value, ParaflowError) and isinstance(info.value, RuntimeError)


def test_cluster_arguments_are_checked_before_anything_is_built():
    with pytest.raises(ClusterError, match="lower-case"):
        Cluster("Bad-Name")
    with pytest.raises(ClusterError, match="1 to 250"):
        Cluster("x", 0)
    with pytest.raises(ClusterError, match="1 to 30"):
        Cluster("x", 2, tcp_retries2=0)
    assert [h.address for h in Cluster("x", 3).hosts] == ["198.18.0.1", "198.18.0.2", "198.18.0.3"]


def test_not_root_is_a_reason_not_a_crash(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "needs root" in support_problem()
