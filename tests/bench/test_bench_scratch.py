"""Each benchmark launch gets scratch directories of its own, gone when it ends, killed or not."""

import json
import os
from pathlib import Path

import pytest
from conftest import RANK_ENV, WORKERS
from test_bench_faults import TINY, tiny_config

from paraflow.bench.driver.matrix import Cell
from paraflow.bench.driver.runner import run_cell
from paraflow.bench.driver.scratch import OMPI_SHARED_MEMORY, launch_scratch


def test_scratch_directories_exist_inside_and_are_gone_after(monkeypatch):
    monkeypatch.delenv(OMPI_SHARED_MEMORY, raising=False)
    with launch_scratch() as env:
        assert os.path.isdir(env["TMPDIR"]) and os.path.isdir(env[OMPI_SHARED_MEMORY])
        assert env[OMPI_SHARED_MEMORY].startswith("/dev/shm/")
        Path(env["TMPDIR"], "left.txt").write_text("x")
    assert not os.path.exists(env["TMPDIR"]) and not os.path.exists(env[OMPI_SHARED_MEMORY])


def test_scratch_directories_go_when_the_launch_raises_and_a_chosen_backing_directory_stays(monkeypatch, tmp_path):
    monkeypatch.setenv(OMPI_SHARED_MEMORY, str(tmp_path))
    with pytest.raises(RuntimeError), launch_scratch() as env:
        assert OMPI_SHARED_MEMORY not in env  # the user's choice is kept
        raise RuntimeError("the launch failed")
    assert not os.path.exists(env["TMPDIR"]) and tmp_path.is_dir()


@pytest.mark.timeout(120)
def test_a_killed_mpirun_launch_leaves_no_shared_memory_or_session_files(tmp_path, monkeypatch):
    for key, value in RANK_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv(OMPI_SHARED_MEMORY, raising=False)
    config = tiny_config(tmp_path, timeout=20)
    cell = Cell("train", "horovod", "mpirun", 2, 1, TINY, tag="scratch")
    result = run_cell(
        cell, config, tmp_path / "raw", 20, entry=lambda c, cfg, out: [str(WORKERS / "bench_scratch.py"), str(out)]
    )
    assert result.status == "timed out", result.error
    records = [json.loads((tmp_path / "raw" / cell.id / f"scratch{r}.json").read_text()) for r in (0, 1)]
    for record in records:
        assert Path(record["tmpdir"]).name.startswith("pf-") and record["shm"].startswith("/dev/shm/pf-")
        assert any(name.startswith("vader_segment") for name in record["files"]), record  # Open MPI used it
        assert not os.path.exists(record["tmpdir"]) and not os.path.exists(record["shm"])
    assert "TMPDIR" not in result.to_dict()["command"]  # not in the recorded command: it is gone
