"""`paraflow bench` end to end: 2 steps, 1 and 2 processes, every backend available here.

The run's terminal tables, JSON, CSV, Markdown and plots must all be there and agree.
"""

import csv
import json
import sys

import pytest
from conftest import RANK_ENV, ROOT

from paraflow.bench.report.outputs import CSV_TABLES
from paraflow.bench.report.tables import (
    ALLREDUCE_COLUMNS,
    MEMCPY_COLUMNS,
    OVERHEAD_COLUMNS,
    TRAINING_COLUMNS,
    build_tables,
    format_value,
)
from paraflow.tools.launch import run_launch

MODELS = ["mlp:width=16", "cnn:width=4", "transformer:width=16,depth=1"]
LABELS = ["mlp(width=16)", "cnn(width=4)", "transformer(width=16,depth=1)"]


def backends_here() -> list:
    import paraflow

    return [n for n, why in paraflow.available_backends().items() if why is None and n != "ddp"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "results"
    names = backends_here()
    cmd = [
        sys.executable,
        "-m",
        "paraflow.tools.cli",
        "bench",
        "--backends",
        ",".join(names),
        "--nprocs",
        "1,2",
        "--models",
        *MODELS,
        "--steps",
        "2",
        "--warmup",
        "1",
        "--min-window",
        "0",
        "--min-bytes",
        "4K",
        "--max-bytes",
        "16K",
        "--overhead-steps",
        "2",
        "--timeout",
        "120",
        "--out",
        str(out),
    ]
    env = {**RANK_ENV, "PARAFLOW_BACKEND": None, "RANK": None, "WORLD_SIZE": None}
    result = run_launch(cmd, timeout=540, env=env, cwd=str(ROOT))  # 14 launches with fsdp
    assert not result.timed_out and result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    return {
        "out": out,
        "stdout": result.stdout,
        "names": names,
        "results": json.loads((out / "results.json").read_text()),
    }


def expected_cells(names: list) -> set:
    cells = {"memcpy", "single-python-1"}
    for name in names:
        if name in ("single", "dp"):
            cells.add(f"{name}-python-1")
            continue
        launchers = ("mpirun", "horovodrun") if name == "horovod" else ("torchrun",)
        cells |= {f"{name}-{launcher}-{n}" for launcher in launchers for n in (1, 2)}
        if has_raw_loop(name):
            cells.add(f"overhead-{name}-{'mpirun' if name == 'horovod' else 'torchrun'}-2")
    return cells


def has_raw_loop(name: str) -> bool:
    """Whether the backend has a hand-written loop, hence an abstraction-overhead cell."""
    from paraflow.core.registry import spec

    registration = spec(name)
    return registration.load().raw_loop(**registration.presets) is not None


@pytest.mark.timeout(600)
def test_every_cell_ran_and_every_column_is_filled(run):
    results, names = run["results"], run["names"]
    assert {"single", "ddp-gloo"} <= set(names)
    assert {c["id"] for c in results["cells"]} == expected_cells(names)
    assert all(c["status"] == "ok" for c in results["cells"]), [c["error"] for c in results["cells"]]
    training = results["tables"]["training"]
    train_cells = [c for c in results["cells"] if c["kind"] == "train"]
    assert len(training) == len(train_cells) * len(MODELS)
    for row in training:
        assert set(row) == set(TRAINING_COLUMNS) and row["status"] == "ok" and row["model"] in LABELS
        optional = {"comm_overhead"} if row["backend"] in ("single", "dp") else set()
        assert all(row[k] is not None for k in TRAINING_COLUMNS if k not in optional), row
        assert row["global_batch"] == row["batch_per_rank"] * row["processes"]
        assert row["samples_per_s_per_process"] == pytest.approx(row["samples_per_s"] / row["processes"], abs=0.1)
        assert row["step_ms_p10"] <= row["step_ms_median"] <= row["step_ms_p90"]
    for label in LABELS:  # same seed, data and step: every backend trains the same way
        for n in (1, 2):
            losses = [r["final_loss"] for r in training if r["model"] == label and r["processes"] == n]
            assert losses and max(losses) - min(losses) <= 1e-3 * max(1.0, abs(losses[0])), (label, n, losses)
    singles = [r for r in training if r["backend"] == "single"]
    assert len(singles) == len(MODELS) and all(r["weak_scaling_efficiency"] == 1.0 for r in singles)
    # 2 allreduce sizes for each 2-process cell, each checked, none wrong, each next to memcpy
    allreduce = results["tables"]["allreduce"]
    assert len(allreduce) == 2 * sum(1 for c in train_cells if c["nproc"] == 2)
    assert {r["size_bytes"] for r in allreduce} == {4096, 16384}
    assert all(r["wrong"] == 0 and r["memcpy_gbps"] > 0 and r["busbw_gbps"] > 0 for r in allreduce)
    assert all(f["avg_busbw_gbps"] > 0 for f in results["tables"]["allreduce_footer"])
    overhead = results["tables"]["overhead"]
    assert {r["backend"] for r in overhead} == {n for n in names if has_raw_loop(n)} >= {"ddp-gloo"}
    assert all(r["abstraction_overhead"] is not None and r["pairs"] == 2 for r in overhead)


@pytest.mark.timeout(600)
def test_terminal_shows_progress_header_and_every_table(run):
    out, results = run["stdout"], run["results"]
    total = len(results["cells"])
    for i in range(1, total + 1):
        assert f"[{i:>{len(str(total))}}/{total}]" in out
    assert f"{total - 1} left" in out and "elapsed" in out
    for header in (
        "torch ",
        "horovod ",
        "MPI: ",
        "gloo: ",
        "NCCL: ",
        "CPU: ",
        "cores",
        "threads per process",
        "GB = 1e9 bytes",
    ):
        assert header in out
    for command in results["header"]["commands"]:
        assert f"$ {command}" in out
    for columns in (TRAINING_COLUMNS, ALLREDUCE_COLUMNS, MEMCPY_COLUMNS, OVERHEAD_COLUMNS):
        for key, header in columns.items():
            if key not in ("model", "backend", "launcher", "processes"):
                assert header in out, header
    assert out.count("# Avg bus bandwidth") == len(results["tables"]["allreduce_footer"])
    for label in LABELS:
        assert f"Training: {label}" in out


@pytest.mark.timeout(600)
def test_tables_rebuild_from_the_raw_per_rank_numbers(run):
    results, out = run["results"], run["out"]
    assert build_tables(results["cells"], results["header"]) == results["tables"]
    for cell in results["cells"]:
        assert len(cell["ranks"]) == cell["nproc"] and cell["command"]
        for r in range(cell["nproc"]):
            assert json.loads((out / "raw" / cell["id"] / f"rank{r}.json").read_text()) == cell["ranks"][r]
    ddp2 = next(c for c in results["cells"] if c["id"] == "ddp-gloo-torchrun-2")
    per_rank = ddp2["ranks"][0]["tasks"]["train/mlp:width=16"]
    assert len(per_rank["step_s"]) == per_rank["steps"] == 2 and "no_sync_step_s" in per_rank


def same(text: str, value) -> bool:
    if value is None:
        return text == ""
    if isinstance(value, bool):
        return text == str(value)
    if isinstance(value, (int, float)):
        return float(text) == float(value)
    return text == str(value)


@pytest.mark.timeout(600)
def test_csv_files_hold_the_json_tables_under_the_header(run):
    results, out = run["results"], run["out"]
    for name, (key, columns) in CSV_TABLES.items():
        lines = (out / name).read_text().splitlines()
        comments = [line for line in lines if line.startswith("#")]
        assert comments[0].startswith("# paraflow ") and any("torch " in line for line in comments)
        assert all(f"#   {c}" in comments for c in results["header"]["commands"])
        rows = list(csv.DictReader([line for line in lines if not line.startswith("#")]))
        assert len(rows) == len(results["tables"][key]) and (rows or key != "training")
        for got, want in zip(rows, results["tables"][key]):
            assert list(got) == list(columns)
            assert all(same(got[k], want[k]) for k in columns), (name, got, want)


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


@pytest.mark.timeout(600)
def test_markdown_shows_the_same_values_and_the_plots(run):
    results, out = run["results"], run["out"]
    text = (out / "results.md").read_text()
    assert "torch " in text and "GB = 1e9 bytes" in text and "## Definitions" in text
    assert all(c in text for c in results["header"]["commands"])
    tables = markdown_tables(text)
    headers = {v: k for k, v in TRAINING_COLUMNS.items()}
    for label in LABELS:
        title = next(t for t in tables if t.startswith(f"Training: {label} "))
        names, body = tables[title]
        rows = [r for r in results["tables"]["training"] if r["model"] == label]
        assert len(body) == len(rows)
        for cells, row in zip(body, rows):
            assert cells == [format_value(headers[h], row[headers[h]]) for h in names]
    for footer in results["tables"]["allreduce_footer"]:
        title = f"Allreduce: {footer['backend']} under {footer['launcher']}, {footer['processes']} processes"
        names, body = tables[title]
        assert [r[names.index("busbw(GB/s)")] for r in body] == [
            format_value("busbw_gbps", r["busbw_gbps"])
            for r in results["tables"]["allreduce"]
            if (r["backend"], r["launcher"], r["processes"]) == (footer["backend"], footer["launcher"], 2)
        ]
        assert f"Avg bus bandwidth : {footer['avg_busbw_gbps']:g} GB/s" in text
    for plot in ("throughput.png", "busbw.png"):
        assert f"![{plot}]({plot})" in text


@pytest.mark.timeout(600)
def test_plots_are_real_pngs(run):
    import matplotlib.image

    for plot in ("throughput.png", "busbw.png"):
        path = run["out"] / plot
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        height, width = matplotlib.image.imread(str(path)).shape[:2]
        assert width >= 800 and height >= 400
