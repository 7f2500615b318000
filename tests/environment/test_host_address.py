"""Rank 0's address across hosts: the interface GLOO_SOCKET_IFNAME names, else the host name."""

import socket

import pytest

from paraflow.environment.launchers import ProcessEnvironment
from paraflow.environment.rendezvous import _rank0_endpoint, host_address, interface_address
from paraflow.errors import LauncherError, ParaflowError

TWO_HOSTS = ProcessEnvironment("openmpi", rank=0, world_size=2, local_rank=0, local_world_size=1)
ONE_HOST = ProcessEnvironment("openmpi", rank=0, world_size=2, local_rank=0, local_world_size=2)


def test_interface_address_reads_the_interface():
    assert interface_address("lo") == "127.0.0.1"


def test_an_interface_that_does_not_exist_is_named_in_the_error():
    with pytest.raises(LauncherError, match="'nosuch0'.*ip -br addr") as info:
        interface_address("nosuch0")
    assert isinstance(info.value, ParaflowError)


def test_gloo_socket_ifname_gives_its_address_not_the_host_name(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo,eth9")  # gloo takes a list; the first one counts
    assert host_address() == "127.0.0.1"
    assert _rank0_endpoint(TWO_HOSTS)[0] == "127.0.0.1"


def test_without_gloo_socket_ifname_the_host_name_is_used(monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    assert host_address() == socket.gethostname()
    assert _rank0_endpoint(TWO_HOSTS)[0] == socket.gethostname()
    assert host_address(lambda: "n0.example") == "n0.example"


def test_one_host_stays_on_loopback_whatever_the_interface(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "nosuch0")
    assert _rank0_endpoint(ONE_HOST)[0] == "127.0.0.1"
