"""Training across hosts changes no number: 2 hosts x 1 process = 1 host x 2 processes = `single`, float64.

tests/workers/equivalence.py trains a float64 MLP for 5 SGD steps with momentum, each rank on its
half of every global batch; with gradients averaged, every layout ends with the parameters
`single` reaches on the whole batch.
"""

import sys

import pytest
import torch
from clusterkit import cluster_fixture, job_env, run_job  # noqa: F401
from conftest import ROOT, WORKERS, launch_ok, requires_horovod

from paraflow.environment.launchers import HostCommand, free_port
from paraflow.tools.cluster import IFNAME, ClusterJob

pytestmark = pytest.mark.cluster
LAYOUTS = [
    pytest.param("ddp-gloo", "torchrun", id="ddp-gloo-torchrun"),
    pytest.param("fsdp", "torchrun", id="fsdp-torchrun"),
    pytest.param("horovod", "mpirun", id="horovod-mpirun", marks=requires_horovod),  # MPI controller
    pytest.param("horovod", "horovodrun", id="horovod-horovodrun", marks=requires_horovod),  # gloo controller
]


def assert_same_parameters(a, b):
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-10, atol=1e-12, msg=key)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend, launcher", LAYOUTS)
def test_two_hosts_match_one_host_and_single(cluster, tmp_path, float64_reference, backend, launcher):
    two_hosts, one_host = tmp_path / "two-hosts.pt", tmp_path / "one-host.pt"
    run_job(cluster, launcher, [WORKERS / "equivalence.py", backend, two_hosts])
    launch_ok(launcher, 2, [WORKERS / "equivalence.py", backend, one_host], timeout=180)
    across = torch.load(two_hosts)
    assert_same_parameters(across, torch.load(one_host))
    assert_same_parameters(across, float64_reference)
    # Guard: the comparison means something only if training moved the parameters.
    from paraflow.examples.models import build_model

    torch.manual_seed(1234)
    initial = build_model("mlp", width=16).double().state_dict()
    assert any(not torch.equal(initial[k], across[k]) for k in initial)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["ddp-gloo", pytest.param("horovod", marks=requires_horovod)])
def test_a_pytorchjob_with_one_process_per_host_matches_single(cluster, tmp_path, float64_reference, backend):
    """Kubernetes' PyTorchJob: each host runs plain `python` with MASTER_ADDR (rank 0's host),
    MASTER_PORT, WORLD_SIZE and RANK, and nothing else of a launcher's."""
    out = tmp_path / "params.pt"
    operator = {"MASTER_ADDR": cluster.hosts[0].address, "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    commands = [
        HostCommand(
            host.name,
            [sys.executable, str(WORKERS / "equivalence.py"), backend, str(out)],
            {**operator, "RANK": str(rank), "GLOO_SOCKET_IFNAME": IFNAME},
        )
        for rank, host in enumerate(cluster.hosts)
    ]
    results = ClusterJob(cluster, commands, env=job_env(), cwd=str(ROOT)).wait(180)
    for result in results:
        assert result.ok, f"exit {result.returncode}:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    assert "torch's env:// variables" in results[0].stderr, results[0].stderr[-2000:]
    assert_same_parameters(torch.load(out), float64_reference)
