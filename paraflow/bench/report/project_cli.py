"""``paraflow bench project DIR``: the cost model from a results folder, running nothing.

Rebuilds every table from the folder's raw numbers (so an older run gets the model too), prints
the fits, the predictions, the projection and the published comparison, and writes
``projection.json``, ``costmodel.csv``, ``projection.csv``, ``published.csv`` and
``projection.png`` into the folder.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from .compare import load_results
from .tables import build_tables, csv_columns, render
from .tables_model import FIT_COLUMNS, PROJECTION_COLUMNS, PUBLISHED_COLUMNS, model_sections

__all__ = ["project_main", "PREDICTION_COLUMNS"]

PREDICTION_COLUMNS = {
    "model": "model",
    "scaling": "scaling",
    "backend": "backend",
    "launcher": "launcher",
    "processes": "procs",
    "link": "link",
    "compute_ms": "compute ms",
    "compute_from": "compute from",
    "comm_ms": "modelled comm ms",
    "predicted_step_ms": "predicted step ms",
    "measured_step_ms": "measured step ms",
    "prediction_error": "prediction error",
}
KEYS = ("costmodel_fit", "predictions", "projection", "published")


def _write_csv(path: Path, rows: list, columns: dict) -> None:
    keys = csv_columns(columns, rows)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in keys})


def project_main(path: str, out=None, plots: bool = True) -> int:
    """Print and write the cost model of the run in `path`; 0 when it could fit and predict something."""
    out = out or sys.stdout
    results = load_results(path)
    tables = build_tables(results["cells"], results["header"], results.get("config"))
    folder = Path(path) if Path(path).is_dir() else Path(path).parent
    (folder / "projection.json").write_text(json.dumps({k: tables[k] for k in KEYS}, indent=1))
    for name, key, columns in (
        ("costmodel.csv", "costmodel_fit", FIT_COLUMNS),
        ("projection.csv", "projection", PROJECTION_COLUMNS),
        ("published.csv", "published", PUBLISHED_COLUMNS),
    ):
        _write_csv(folder / name, tables[key], columns)
    sections = model_sections(tables, "simple")
    if tables["predictions"]:
        sections.insert(1, ("Predicted against measured step time", render(tables["predictions"], PREDICTION_COLUMNS)))
    for title, text in sections:
        print(f"\n{title}\n{text}", file=out)
    if plots and tables["projection"]:
        from .plots import _save
        from .plots_projection import projection_figure

        _save(projection_figure(tables, results["header"]), folder / "projection.png")
    print(f"\nwrote projection.json, costmodel.csv, projection.csv, published.csv to {folder}/", file=out)
    return 0 if tables["predictions"] else 1
