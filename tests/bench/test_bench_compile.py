"""`paraflow bench --compile no,yes`: every backend's rows eager and compiled side by side.

One run over ddp-gloo, fsdp and horovod at 2 processes with the mlp: each cell is launched eager
and compiled; the compiled rows carry throughput with its interval, as the eager ones, and the
seconds of the compiling first step, kept out of the timed window; both train the same model.
"""

import json
import sys

import pytest
from conftest import RANK_ENV, ROOT, requires_horovod

from paraflow.bench.driver.cli import add_arguments, config_from_args
from paraflow.bench.driver.config import BenchConfig
from paraflow.bench.driver.matrix import build_matrix
from paraflow.bench.driver.runner import worker_args
from paraflow.errors import ConfigurationError
from paraflow.tools.launch import run_launch

pytestmark = pytest.mark.xdist_group("bench-compile")

BACKENDS = ("ddp-gloo", "fsdp", "horovod")
COMMAND = (
    "paraflow bench --backend ddp-gloo,fsdp,horovod --nprocs 2 --model mlp:width=16 --compile no,yes "
    "--no-allreduce --no-aa-check --repeat 2 --max-repeat 2 --window-steps 3 --warmup 2 "
    "--max-warmup 0.1"
)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """docs/compile.md's command, run as printed (from a scratch folder: its default --out lands there)."""
    here = tmp_path_factory.mktemp("bench-compile")
    cmd = [sys.executable, "-m", "paraflow.cli", *COMMAND.split()[1:]]
    env = {**RANK_ENV, "PARAFLOW_BACKEND": None, "RANK": None, "WORLD_SIZE": None}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(here / "inductor-cache")
    result = run_launch(cmd, timeout=600, env=env, cwd=str(here))
    assert not result.timed_out and result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    out = here / "bench-results"
    return json.loads((out / "results.json").read_text()), result.stdout, (out / "results.md").read_text()


def test_the_docs_print_this_command():
    assert COMMAND in (ROOT / "docs" / "compile.md").read_text()


@requires_horovod
@pytest.mark.timeout(660)
def test_each_backend_has_an_eager_and_a_compiled_row_with_intervals(results):
    tables = results[0]["tables"]
    rows = {(r["backend"], r["compiled"]): r for r in tables["training"]}
    assert set(rows) == {(b, c) for b in ("single", *BACKENDS) for c in ("no", "yes")}
    for (backend, compiled), row in rows.items():
        assert row["status"] == "ok" and row["launches"] == 2, row
        for key in ("samples_per_s", "step_ms_median"):
            assert row[f"{key}_low"] <= row[key] <= row[f"{key}_high"], (backend, compiled, key)
        if compiled == "yes":
            assert 0 < row["compile_s_low"] <= row["compile_s"] <= row["compile_s_high"], row
            # the compiling step is not a timed one: it takes far longer than any timed step
            assert row["compile_s"] * 1e3 > row["step_ms_p90"], row
            assert row["final_loss"] == pytest.approx(rows[backend, "no"]["final_loss"], rel=1e-4), backend
        else:
            assert row["compile_s"] is None
    assert "compile s" in results[2], "results.md shows no compile time"


@requires_horovod
@pytest.mark.timeout(660)
def test_the_compiled_launches_ran_compiled_models(results):
    cells = [c for c in results[0]["cells"] if c["kind"] == "train"]
    compiled = [c for c in cells if c["compiled"]]
    assert {c["backend"] for c in compiled} == {"single", *BACKENDS}
    for cell in cells:
        for rank in cell["ranks"]:
            (task,) = rank["tasks"].values()
            assert task["compiled"] is cell["compiled"] and (task["compile_s"] is not None) is cell["compiled"]


def test_the_compile_axis_doubles_the_cells_and_reaches_the_worker():
    config = BenchConfig(backends=["ddp-gloo"], nprocs=[2], compile=["no", "yes"], aa_check=False, allreduce=False)
    matrix = build_matrix(config, available={"single": None, "ddp-gloo": None}, cuda_devices=0, total_cores=2)
    groups = sorted({c.group for c in matrix.cells})
    assert groups == [
        "ddp-gloo-torchrun-2",
        "ddp-gloo-torchrun-2-compiled",
        "single-python-1",
        "single-python-1-compiled",
    ]
    for cell in matrix.cells:
        assert json.loads(worker_args(cell, config, ROOT)[3])["compile"] is cell.compiled


@pytest.mark.parametrize(
    "argv, expected", [([], ["no"]), (["--compile"], ["no", "yes"]), (["--compile", "yes"], ["yes"])]
)
def test_the_compile_flag(argv, expected):
    import argparse

    args = add_arguments(argparse.ArgumentParser()).parse_args(argv)
    assert config_from_args(args).compile == expected


def test_a_wrong_compile_value_names_the_accepted_ones():
    with pytest.raises(ConfigurationError, match="no,yes"):
        BenchConfig(compile=["maybe"])


def test_a_script_compiles_its_model_itself():
    with pytest.raises(ConfigurationError, match="--compile need the built-in loop"):
        BenchConfig(script=str(ROOT / "train.py"), compile=["no", "yes"])
