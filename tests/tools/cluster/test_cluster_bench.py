"""The benchmark on two emulated hosts: every cell runs, each rank on its own host, the link in the header."""

import json

import pytest
from clusterkit import skip_without_namespaces

from paraflow.bench.driver.config import BenchConfig
from paraflow.bench.driver.run import run_bench
from paraflow.tools.cluster import cluster_names

pytestmark = pytest.mark.cluster


@pytest.mark.timeout(600)
def test_bench_on_two_hosts_with_shaped_links(tmp_path):
    skip_without_namespaces()
    before = cluster_names()
    config = BenchConfig(
        backends=["ddp-gloo"],
        models=["mlp:width=16"],
        warmup=1,
        steps=2,
        min_window=0,
        repeat=1,
        aa_check=False,
        sizes=[4096],
        plots=False,
        out=str(tmp_path),
        cluster=2,
        bandwidth="1gbit",
    )
    results = run_bench(config, progress=False)
    assert all(c["status"] == "ok" for c in results["cells"]), [c["error"] for c in results["cells"]]
    trained = {(c["backend"], c["nproc"]) for c in results["cells"] if c["kind"] == "train"}
    assert trained == {("single", 1), ("ddp-gloo", 2)}
    assert results["header"]["cluster"]["bandwidth"] == "1gbit"
    assert "1gbit both ways" in (tmp_path / "results.md").read_text()
    ddp = next(c for c in results["cells"] if c["backend"] == "ddp-gloo")
    assert ddp["command"].count("paraflow cluster exec") == 2  # torchrun on each host
    hosts = {json.loads((tmp_path / "raw" / ddp["id"] / f"rank{r}.json").read_text())["host"] for r in (0, 1)}
    assert hosts == {"node0", "node1"}
    assert cluster_names() == before  # the run's cluster is gone
