"""`paraflow bench --trace` under horovod: its timeline and a torch.profiler trace per rank (the DDP
side is in test_bench_e2e.py)."""

import json
import sys

import pytest
from conftest import RANK_ENV, ROOT

from paraflow.bench.rank.train_loop import trace_name
from paraflow.tools.launch import run_launch

hvd = pytest.importorskip("horovod.torch", reason="horovod is not installed: pip install 'paraflow[horovod]'")


def read_chrome_trace(path) -> list:
    """The events of a Chrome trace: an object with traceEvents, or an array whose closing ] the
    format allows to be missing (horovod's timeline while it is open)."""
    text = path.read_text().strip()
    try:
        data = json.loads(text)
    except ValueError:
        data = json.loads(text.rstrip(",") + "]")
    return data["traceEvents"] if isinstance(data, dict) else data


@pytest.mark.timeout(300)
def test_horovod_trace_has_every_rank_in_its_timeline_and_profiles(tmp_path):
    out = tmp_path / "results"
    cmd = [sys.executable, "-m", "paraflow.cli", "bench", "--backend", "horovod", "--launcher", "mpirun"]
    cmd += ["--nprocs", "2", "--model", "mlp:width=16", "--window-steps", "2", "--warmup", "1", "--max-warmup", "0.05"]
    cmd += ["--min-window", "0", "--repeat", "1", "--max-repeat", "1", "--no-aa-check", "--no-allreduce"]
    cmd += ["--no-overhead", "--no-plots"]
    cmd += ["--trace"]
    cmd += ["--launch-timeout", "120", "--out", str(out)]
    env = {**RANK_ENV, "PARAFLOW_BACKEND": None, "RANK": None, "WORLD_SIZE": None}
    result = run_launch(cmd, timeout=280, env=env, cwd=str(ROOT))
    assert not result.timed_out and result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    results = json.loads((out / "results.json").read_text())
    folder = "traces/horovod-mpirun-2-trace"
    assert f"{folder}/horovod-timeline.json" in results["traces"]
    events = read_chrome_trace(out / folder / "horovod-timeline.json")
    negotiated = {str(e.get("name")) for e in events}  # rank r ready for a tensor: an event named r
    assert {"0", "1"} <= negotiated and any("ALLREDUCE" in str(e.get("name")) for e in events)
    pids = []  # one profile per rank, each from its own process
    for r in range(2):
        trace = json.loads((out / folder / trace_name("mlp(width=16)", r)).read_text())
        assert any(e.get("ph") == "X" for e in trace["traceEvents"])
        pids.append({e["pid"] for e in trace["traceEvents"] if e.get("ph") == "X" and isinstance(e["pid"], int)})
    assert pids[0] and pids[1] and not pids[0] & pids[1]
