"""`paraflow bench` end to end: 2 steps, a repeated launch per cell, ddp-gloo against the single baseline.

The run's terminal tables, JSON, CSV, Markdown and plots must all be there, agree, and carry
the 95% intervals over launches.
"""

import csv
import json
import sys

import pytest
from conftest import RANK_ENV, ROOT

from paraflow.bench.report.outputs import CSV_TABLES
from paraflow.bench.report.tables import (
    SWEEP_COLUMNS,
    TRAINING_COLUMNS,
    build_tables,
    csv_columns,
    format_cell,
)
from paraflow.tools.launch import run_launch

MODELS = ["mlp:width=16", "transformer:width=16,depth=1"]
LABELS = ["mlp(width=16)", "transformer(width=16,depth=1)"]
REPEAT = 2


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "results"
    cmd = [
        sys.executable,
        "-m",
        "paraflow.cli",
        "bench",
        "--backend",
        "ddp-gloo",
        "--nprocs",
        "2",
        *[arg for m in MODELS for arg in ("--model", m)],
        "--window-steps",
        "2",
        "--warmup",
        "1",
        "--max-warmup",
        "0.05",
        "--min-window",
        "0",
        "--repeat",
        str(REPEAT),
        "--max-repeat",  # every cell of a 2-step run is noisy: no extra launches here
        str(REPEAT),
        "--min-bytes",
        "4K",
        "--max-bytes",
        "16K",
        "--scaling",
        "weak,strong",
        "--launch-timeout",
        "120",
        "--out",
        str(out),
    ]
    env = {**RANK_ENV, "PARAFLOW_BACKEND": None, "RANK": None, "WORLD_SIZE": None}
    result = run_launch(cmd, timeout=420, env=env, cwd=str(ROOT))
    assert not result.timed_out and result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    return {"out": out, "stdout": result.stdout, "results": json.loads((out / "results.json").read_text())}


EXPECTED_CELLS = {
    "single-python-1-aa-r1",
    "single-python-1-aa-r2",
    *{f"{c}-r{r}" for c in ("single-python-1", "ddp-gloo-torchrun-2") for r in range(1, REPEAT + 1)},
}


@pytest.mark.timeout(480)
def test_every_cell_ran_and_every_column_is_filled(run):
    results = run["results"]
    assert {c["id"] for c in results["cells"]} == EXPECTED_CELLS
    assert all(c["status"] == "ok" for c in results["cells"]), [c["error"] for c in results["cells"]]
    training = results["tables"]["training"]
    # single and ddp-gloo, weak and strong scaling
    assert len(training) == 2 * len(MODELS) * 2
    for row in training:
        assert set(TRAINING_COLUMNS) <= set(row) and row["status"] == "ok" and row["model"] in LABELS
        optional = {"comm_overhead"} if row["backend"] == "single" else set()
        optional |= {"peak_cuda_mb"} if row["device"] == "cpu" else set()
        optional |= {"speedup"} if row["scaling"] == "weak" else set()
        optional |= {"compile_s"} if row["compiled"] == "no" else set()
        optional |= {"predicted_step_ms", "prediction_error"} if row["processes"] == 1 else set()  # no sweep
        assert all(row[k] is not None for k in TRAINING_COLUMNS if k not in optional), row
        assert row["launches"] == REPEAT and row["global_batch"] == row["batch_per_rank"] * row["processes"]
        assert row["global_batch"] == (32 if row["scaling"] == "strong" else 32 * row["processes"])
        for key in ("step_ms_median", "samples_per_s", "scaling_efficiency"):
            assert row[f"{key}_low"] <= row[key] <= row[f"{key}_high"], (key, row)
    # same seed, data and step: every launch of a cell reaches the same loss after --warmup steps,
    # however long its warm-up then ran
    for cell_id in ("single-python-1", "ddp-gloo-torchrun-2"):
        for spec in MODELS:
            for r in range(int(cell_id[-1])):  # each rank's own loss, launch after launch
                losses = [
                    c["ranks"][r]["tasks"][f"train/{spec}"]["warmup_losses"][0]
                    for c in results["cells"]
                    if c["group"] == cell_id
                ]
                assert len(losses) == REPEAT and max(losses) - min(losses) <= 1e-5, (cell_id, r, losses)
    assert results["header"]["noise_floor"]["spread"] is not None
    sweep = results["tables"]["sweep"]
    assert {r["size_bytes"] for r in sweep} == {4096, 16384} and len(sweep) == 2
    assert all(r["wrong"] == 0 and r["busbw"] > 0 and r["impl"] == "raw" for r in sweep)
    assert all(r["busbw_low"] <= r["busbw"] <= r["busbw_high"] for r in sweep)
    assert results["verdict"] == results["tables"]["verdict"] and len(results["verdict"]) >= len(MODELS)
    assert all(v["claim"] and v["text"] for v in results["verdict"])


@pytest.mark.timeout(480)
def test_terminal_shows_progress_then_the_verdict_and_a_compact_table(run):
    out, results = run["stdout"], run["results"]
    total = len(results["cells"])
    assert f"[{1:>{len(str(total))}}/{total}]" in out and f"[{total}/{total}]" in out and "elapsed" in out
    assert out.count("\n") <= 60, out  # the answer on one screen
    verdict = out.index("Verdict (throughput")
    for label in LABELS:
        assert f"  {label}, 2 processes: " in out[verdict:]
    assert "backend·launcher" in out and "samples/s [95%]" in out and "peak RSS MB/rank" in out


@pytest.mark.timeout(480)
def test_results_md_holds_the_header_every_table_and_the_commands(run):
    results = run["results"]
    md = (run["out"] / "results.md").read_text()
    for header in ("torch ", "horovod ", "MPI: ", "CPU: ", "cores", "threads per process", "GB = 1e9 bytes"):
        assert header in md
    assert "noise floor (A/A check:" in md
    for command in results["header"]["commands"]:
        assert command in md
    for columns in (TRAINING_COLUMNS, SWEEP_COLUMNS):
        for key, header in columns.items():
            if key not in (
                "model",
                "backend",
                "launcher",
                "processes",
                "scaling",
                "transport",
                "device",
                "batch_per_rank",
                "parameters",
                "grad_mb_per_step",
                "speedup",
                "collective",
                "peak_cuda_mb",
                "compiled",  # an eager-only run hides the compile columns
                "compile_s",
            ):
                assert header in md, header
    assert "compile s" not in md, "an eager-only run shows compile columns"
    assert md.count("# Avg bus bandwidth") == len(results["tables"]["sweep_footer"])
    assert "## Verdict" in md and all(v["text"] in md for v in results["verdict"])
    for label in LABELS:
        assert f"Training: {label}, weak scaling" in md and f"Training: {label}, strong scaling" in md


@pytest.mark.timeout(480)
def test_tables_rebuild_from_the_raw_per_rank_numbers(run):
    results, out = run["results"], run["out"]
    assert build_tables(results["cells"], results["header"], results["config"]) == results["tables"]
    for cell in results["cells"]:
        assert len(cell["ranks"]) == cell["nproc"] and cell["command"]
        for r in range(cell["nproc"]):
            assert json.loads((out / "raw" / cell["id"] / f"rank{r}.json").read_text()) == cell["ranks"][r]
    ddp2 = next(c for c in results["cells"] if c["id"] == "ddp-gloo-torchrun-2-r1")
    assert ddp2["ranks"][0]["tasks"]["train-strong/mlp:width=16"]["batch_per_rank"] == 16  # 32 split over 2
    per_rank = ddp2["ranks"][0]["tasks"]["train/mlp:width=16"]
    assert len(per_rank["step_s"]) == per_rank["steps"] == 2 and "no_sync_step_s" in per_rank
    assert per_rank["warmup"] >= 1 and "warmup_settled" in per_rank


def same(text: str, value) -> bool:
    if value is None:
        return text == ""
    if isinstance(value, bool):
        return text == str(value)
    if isinstance(value, (int, float)):
        return float(text) == float(value)
    return text == str(value)


@pytest.mark.timeout(480)
def test_csv_files_hold_the_json_tables_and_their_intervals_under_the_header(run):
    results, out = run["results"], run["out"]
    for name, (key, columns) in CSV_TABLES.items():
        lines = (out / name).read_text().splitlines()
        comments = [line for line in lines if line.startswith("#")]
        assert comments[0].startswith("# paraflow ") and any("torch " in line for line in comments)
        assert all(f"#   {c}" in comments for c in results["header"]["commands"])
        rows = list(csv.DictReader([line for line in lines if not line.startswith("#")]))
        assert len(rows) == len(results["tables"][key]) and (rows or key != "training")
        keys = csv_columns(columns, results["tables"][key])
        for got, want in zip(rows, results["tables"][key]):
            assert list(got) == keys
            assert all(same(got[k], want.get(k)) for k in keys), (name, got, want)
    header = (out / "training.csv").read_text().splitlines()[len(comments)]
    assert "step_ms_median_low,step_ms_median_high" in header and "samples_per_s_low" in header


def markdown_tables(text: str) -> dict:
    """Section title -> (headers, rows) of the first table under each `## ` heading."""
    tables, title, lines = {}, None, text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("## "):
            title = line[3:]
        elif (
            line.startswith("|")
            and title
            and title not in tables
            and i + 1 < len(lines)
            and lines[i + 1].startswith("|-")
        ):

            def split(row):
                return [c.strip() for c in row.strip().strip("|").split(" | ")]

            body = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                body.append(split(row))
            tables[title] = (split(line), body)
    return tables


@pytest.mark.timeout(480)
def test_markdown_shows_the_same_values_and_the_plots(run):
    results, out = run["results"], run["out"]
    text = (out / "results.md").read_text()
    assert "torch " in text and "GB = 1e9 bytes" in text and "## Definitions" in text
    assert all(c in text for c in results["header"]["commands"])
    tables = markdown_tables(text)
    headers = {v: k for k, v in TRAINING_COLUMNS.items()}
    for label in LABELS:
        title = next(t for t in tables if t.startswith(f"Training: {label}, weak scaling "))
        names, body = tables[title]
        rows = [r for r in results["tables"]["training"] if r["model"] == label and r["scaling"] == "weak"]
        assert len(body) == len(rows)
        for cells, row in zip(body, rows):
            assert cells == [format_cell(headers[h], row) for h in names]
            assert "±" in cells[names.index("step ms median")] and "[" in cells[names.index("scaling eff")]
    for footer in results["tables"]["sweep_footer"]:
        title = f"Allreduce float32: {footer['backend']} under {footer['launcher']}, {footer['processes']} processes"
        names, body = tables[title]
        assert [r[names.index("busbw(GB/s)")] for r in body] == [
            format_cell("busbw", r) for r in results["tables"]["sweep"] if r["backend"] == footer["backend"]
        ]
        assert f"Avg bus bandwidth : {footer['avg_busbw']:g} GB/s" in text
    assert "## Verdict" in text and all(v["text"].replace("|", "\\|") in text for v in results["verdict"])
    assert "![throughput.png](throughput.png)" in text


@pytest.mark.timeout(480)
def test_the_plot_is_a_real_png_with_error_bars_from_the_intervals(run):
    import matplotlib.image
    from matplotlib.container import ErrorbarContainer

    from paraflow.bench.report.plots import require_pyplot, throughput_figure

    path = run["out"] / "throughput.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width = matplotlib.image.imread(str(path)).shape[:2]
    assert width >= 800 and height >= 400
    tables, header = run["results"]["tables"], run["results"]["header"]
    fig = throughput_figure(tables["training"], header)
    rows = [r for r in tables["training"] if r["scaling"] == "weak"]  # the figure shows weak scaling
    bars = [c for ax in fig.axes for c in ax.containers if isinstance(c, ErrorbarContainer)]
    segments = [seg for c in bars for lines in c.lines[2] for seg in lines.get_segments()]
    spans = sorted(round(float(abs(s[1][1] - s[0][1])), 6) for s in segments)  # each bar's low..high
    want = sorted(round(r["samples_per_s_high"] - r["samples_per_s_low"], 6) for r in rows)
    assert bars and all(any(abs(w - s) <= 1e-3 * max(1.0, w) for s in spans) for w in want), (spans, want)
    require_pyplot().close(fig)


@pytest.mark.timeout(480)
def test_the_cost_model_fits_the_sweep_predicts_the_rows_and_projects(run, tmp_path):
    results = run["results"]
    tables = results["tables"]
    (fit,) = tables["costmodel_fit"]
    assert fit["backend"] == "ddp-gloo" and fit["algorithm"] == "ring" and fit["status"].startswith("ok")
    assert fit["alpha_us"] > 0 and fit["sizes"] == 2 and fit["rms_residual"] is not None
    multi = [r for r in tables["training"] if r["processes"] == 2]
    assert len(multi) == 2 * len(MODELS) and len(tables["predictions"]) == len(multi)
    for row in multi:
        assert row["predicted_step_ms"] > 0
        assert row["prediction_error"] == pytest.approx(row["predicted_step_ms"] / row["step_ms_median"] - 1, abs=1e-3)
    projected = tables["projection"]
    assert {r["model"] for r in projected} == set(LABELS) and {r["hosts"] for r in projected} == {8, 32, 128}
    md = (run["out"] / "results.md").read_text()
    assert "PROJECTION to many hosts" in md and "prediction error" in md
    # `bench project` rebuilds the same from a copy of the folder, running nothing
    (tmp_path / "results.json").write_text(json.dumps(results))
    done = run_launch(
        [sys.executable, "-m", "paraflow.cli", "bench", "project", str(tmp_path)],
        timeout=120,
        env={**RANK_ENV},
        cwd=str(ROOT),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    written = json.loads((tmp_path / "projection.json").read_text())
    assert written["projection"] == projected and written["costmodel_fit"] == tables["costmodel_fit"]
    assert "Predicted against measured" in done.stdout
