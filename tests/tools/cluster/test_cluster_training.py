"""Training across hosts changes no number: 2 hosts x 1 process = 1 host x 2 processes = `single`, float64.

tests/workers/equivalence.py trains a float64 MLP for 5 SGD steps with momentum, each rank on its
half of every global batch; with gradients averaged, every layout ends with the parameters
`single` reaches on the whole batch.
"""

import pytest
import torch
from clusterkit import cluster_fixture, run_job  # noqa: F401
from conftest import WORKERS, launch_ok, requires_horovod

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
