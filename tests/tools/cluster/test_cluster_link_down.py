"""A host's link goes down mid-training: the job ends within 60 s, names the rank it lost, leaves nothing.

Ranks train until node1's eth0 is taken down (``ip link set eth0 down`` in its namespace). Each
rank's gradient allreduce then times out (paraflow timeout 10 s); rank 0's error names rank 1;
the launchers give up on the cut-off host through TCP (the hosts' tcp_retries2) and Open MPI's
keepalive probes. Every launcher process on both hosts must have exited, none killed by the test.
"""

import json
import time

import pytest
from clusterkit import CLUSTER_WORKERS, TIMEOUT_S, cluster_fixture, start_job  # noqa: F401

pytestmark = pytest.mark.cluster
#: How soon after the cut every process of the job must be gone.
EXIT_BOUND_S = 60
#: How long the ranks may take to start and get 5 steps done on a loaded 2-core machine.
STARTUP_S = 120


@pytest.mark.timeout(STARTUP_S + EXIT_BOUND_S + 60)
@pytest.mark.parametrize("launcher", ["torchrun", "mpirun"])
def test_a_link_down_ends_the_job_and_names_the_unreachable_rank(cluster, tmp_path, launcher):
    job = start_job(cluster, launcher, [CLUSTER_WORKERS / "train_until_cut.py", "ddp-gloo", tmp_path])
    try:
        deadline = time.monotonic() + STARTUP_S
        while not all((tmp_path / f"rank{r}.started").exists() for r in (0, 1)):
            assert not job.poll(), f"the job ended before training got going: {job.wait(1)}"
            assert time.monotonic() < deadline, f"training did not start within {STARTUP_S} s"
            time.sleep(0.2)
        node1 = cluster.host("node1")
        cluster.set_link(node1.name, up=False)
        cut = time.monotonic()
        while not job.poll() and time.monotonic() - cut < EXIT_BOUND_S:
            time.sleep(0.2)
        ended_after = time.monotonic() - cut
        left = cluster.processes()  # before wait() kills anything
        results = job.wait(timeout=time.monotonic() - job.started)  # all exited, or killed now
    finally:
        cluster.set_link("node1", up=True)
    output = "\n".join(r.stdout + r.stderr for r in results)
    assert ended_after < EXIT_BOUND_S, f"the job was still running {EXIT_BOUND_S} s after the cut: {left}"
    assert not left, f"processes left in the cluster's namespaces: {left}"
    assert all(r.returncode != 0 for r in results), output[-3000:]
    rank0 = json.loads((tmp_path / "rank0.error").read_text())
    assert rank0["type"] == "CollectiveTimeoutError", rank0
    assert f"rank 1 did not join it within the timeout of {TIMEOUT_S} s" in rank0["message"]
    assert "cannot be reached" in rank0["message"]
    assert "rank 1 did not join" in output  # the launcher's output carries it too
