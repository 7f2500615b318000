"""`paraflow bench project DIR`: the cost model of a finished run, printed and written beside it
(projection.json, costmodel.csv, projection.csv)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ...errors import ConfigurationError
from .costmodel import KEYS, PREDICTION_COLUMNS
from .outputs import CSV_TABLES, model_sections, write_csv
from .tables import build_tables, render


def load_results(path: str) -> dict:
    """results.json from a results folder (or the file itself)."""
    file = Path(path)
    if file.is_dir():
        file = file / "results.json"
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigurationError(
            f"cannot read benchmark results from {path!r} ({exc}); give a folder written by `paraflow bench --out DIR`."
        ) from None


__all__ = ["project_main"]


def project_main(path: str, out=None) -> int:
    """Print and write the cost model of the run in `path`; 0 when it could fit and predict something."""
    out = out or sys.stdout
    results = load_results(path)
    tables = build_tables(results["cells"], results["header"], results.get("config"))
    folder = Path(path) if Path(path).is_dir() else Path(path).parent
    (folder / "projection.json").write_text(json.dumps({k: tables[k] for k in KEYS}, indent=1))
    for name, (key, columns) in CSV_TABLES.items():
        if key in KEYS:  # costmodel.csv, projection.csv
            write_csv(folder / name, tables[key], columns, results["header"])
    sections = model_sections(tables, "simple")
    if tables["predictions"]:
        sections.insert(1, ("Predicted against measured step time", render(tables["predictions"], PREDICTION_COLUMNS)))
    for title, text in sections:
        print(f"\n{title}\n{text}", file=out)
    print(f"\nwrote projection.json, costmodel.csv, projection.csv to {folder}/", file=out)
    return 0 if any(d.get("status", "ok") == "ok" for d in tables["predictions"]) else 1
