"""A cell that fails, hangs or loses a rank shows up as a failed cell and the matrix goes on; a
cell whose interval stays wide is launched again."""

import io
from pathlib import Path

import pytest
from conftest import RANK_ENV, WORKERS

from paraflow.bench import BenchConfig, ModelSpec, run_bench
from paraflow.bench.driver.matrix import Cell, Matrix
from paraflow.bench.driver.runner import worker_entry

TIMEOUT = 25
TINY = (ModelSpec.parse("mlp:width=16"),)


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.fixture
def rank_env(monkeypatch):
    for key, value in RANK_ENV.items():
        monkeypatch.setenv(key, value)


def tiny_config(tmp_path, **extra) -> BenchConfig:
    """Two timed steps of a tiny model, training only."""
    return BenchConfig(
        models=list(TINY),
        steps=2,
        warmup=1,
        min_window=0,
        out=str(tmp_path / "out"),
        allreduce=False,
        **extra,
    )


def entry(cell, config, out_dir):
    if cell.tag in ("hang", "one-rank"):
        return [str(WORKERS / "bench_faulty.py"), cell.tag, str(out_dir)]
    return worker_entry(cell, config, out_dir)


@pytest.mark.timeout(240)
def test_failed_hung_and_incomplete_cells_are_reported_and_the_rest_completes(tmp_path, rank_env, capsys):
    config = tiny_config(tmp_path, timeout=TIMEOUT)
    cells = [
        Cell("train", "single", "python", 1, 1, TINY),
        # a real worker, failing: 30 is not divisible by the transformer's 4 heads
        Cell("train", "ddp-gloo", "torchrun", 2, 1, (ModelSpec.parse("transformer:width=30"),)),
        Cell("train", "ddp-gloo", "torchrun", 2, 1, TINY, tag="hang"),
        Cell("train", "ddp-gloo", "torchrun", 2, 1, TINY, tag="one-rank"),
        Cell("train", "single", "python", 1, 1, TINY, tag="again"),
    ]
    results = run_bench(config, matrix=Matrix(cells=cells), entry=entry)
    out = capsys.readouterr().out

    status = {c["id"]: c for c in results["cells"]}
    assert [c["status"] for c in results["cells"]] == ["ok", "failed", "timed out", "failed", "ok"], out
    assert "embed_dim must be divisible by num_heads" in status["ddp-gloo-torchrun-2"]["error"]
    hung = status["ddp-gloo-torchrun-2-hang"]
    assert f"timed out after {TIMEOUT} s" in hung["error"] and hung["elapsed_s"] < TIMEOUT + 15
    pids = [int(p.name) for p in (tmp_path / "out" / "raw" / "ddp-gloo-torchrun-2-hang" / "pids").iterdir()]
    assert len(pids) == 2 and not any(alive(pid) for pid in pids), "a hung rank outlived its launch"
    assert hung["ranks"] == [{"rank": 0, "tasks": {}}]  # what it wrote before hanging is kept
    assert status["ddp-gloo-torchrun-2-one-rank"]["error"] == "rank(s) 1 wrote no results"

    rows = results["tables"]["training"]
    assert len(rows) == 5
    good = [r for r in rows if r["status"] == "ok"]
    assert [r["backend"] for r in good] == ["single", "single"] and all(r["samples_per_s"] > 0 for r in good)
    bad = [r for r in rows if r["status"] != "ok"]
    assert all(r["samples_per_s"] is None and r["step_ms_median"] is None for r in bad)
    assert any(r["status"].startswith("timed out") for r in bad)

    assert "[5/5]" in out and "FAILED cells:" in out
    assert "TIMED OUT: timed out after" in out and "AssertionError: embed_dim" in out
    assert (tmp_path / "out" / "results.json").exists() and (tmp_path / "out" / "results.md").exists()
    assert "## Failed cells" in (tmp_path / "out" / "results.md").read_text()


@pytest.mark.timeout(240)
def test_a_wide_cell_is_launched_again_up_to_max_repeat(tmp_path, rank_env):
    # every interval is wider than noisy=1e-6: every cell is noisy
    config = tiny_config(tmp_path, repeat=2, max_repeat=3, noisy=1e-6, plots=False)
    cells = [Cell("train", "single", "python", 1, 1, TINY, repeat=r) for r in (1, 2)]
    progress = io.StringIO()
    results = run_bench(config, matrix=Matrix(cells=cells), progress=progress)
    assert [c["id"] for c in results["cells"]] == ["single-python-1-r1", "single-python-1-r2", "single-python-1-r3"]
    # the extra launch's progress line counts the run's time, not its own from zero
    (line,) = [x for x in progress.getvalue().splitlines() if x.startswith("[extra: intervals still wide]")]
    minutes, seconds = line.split()[4].split(":")
    assert 60 * int(minutes) + int(seconds) >= int(sum(c["elapsed_s"] for c in results["cells"][:2])), line
    assert " · launch 3 · ok (" in line and " left" not in line, line
    assert all(c["status"] == "ok" for c in results["cells"])
    assert results["header"]["extra_launches"]["cells"] == {"single-python-1": 1}
    (row,) = results["tables"]["training"]
    assert row["launches"] == 3 and "step" in row["noisy"]
    report = (tmp_path / "out" / "results.md").read_text()
    assert "extra launches (a cell's interval still wider than --noisy after --repeat 2" in report
    assert "single-python-1 +1" in report
