"""Every launcher across two emulated hosts, one process each: who each rank is, and that it talks over eth0.

torchrun runs on both hosts (c10d rendezvous on node0); mpirun and horovodrun run on node0 and
reach node1 through the ssh stand-in.
"""

import pytest
from clusterkit import CLUSTER_WORKERS, cluster_fixture, run_job  # noqa: F401
from conftest import read_rank_json, requires_horovod

pytestmark = pytest.mark.cluster
LAUNCHES = [
    pytest.param("torchrun", "ddp-gloo", "torchrun", id="torchrun-ddp-gloo"),
    pytest.param("torchrun", "fsdp", "torchrun", id="torchrun-fsdp"),
    pytest.param("mpirun", "ddp-gloo", "openmpi", id="mpirun-ddp-gloo"),
    pytest.param("horovodrun", "horovod", "horovodrun", id="horovodrun-horovod", marks=requires_horovod),
    pytest.param("mpirun", "horovod", "openmpi", id="mpirun-horovod", marks=requires_horovod),
    pytest.param("torchrun", "horovod", "torchrun", id="torchrun-horovod", marks=requires_horovod),
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("launcher, backend, detected", LAUNCHES)
def test_two_hosts_one_rank_each(cluster, tmp_path, launcher, backend, detected):
    run_job(cluster, launcher, [CLUSTER_WORKERS / "whoami.py", backend, tmp_path])
    ranks = read_rank_json(tmp_path, 2)
    assert sorted(r["host"] for r in ranks) == ["node0", "node1"]
    for rank, report in enumerate(ranks):
        assert report["launcher"] == detected
        assert (report["rank"], report["backend_rank"], report["world_size"]) == (rank, rank, 2)
        assert (report["local_rank"], report["local_world_size"]) == (0, 1)
        assert report["sum"] == 3.0 and report["uniform"]  # 1 + 2, on every element
        # The 1 MB allreduce crossed this host's link (loopback and shared memory do not count).
        assert report["link_bytes"] >= 1_000_000, report
        assert report["repeated_sums"] == [2.0], report
    rank0 = cluster.host(ranks[0]["host"])
    if ranks[0]["master"] is not None:  # horovodrun's gloo controller has its own rendezvous
        assert {tuple(r["master"]) for r in ranks} == {tuple(ranks[0]["master"])}
        # torchrun sets MASTER_ADDR to rank 0's host name; under mpirun paraflow picks it: eth0's address.
        assert ranks[0]["master"][0] == (rank0.address if detected == "openmpi" else rank0.name)
