"""Two runs side by side: `paraflow bench --compare RUN_A RUN_B`.

For every training row both runs have, the median step time and samples/s of each run with its
95% interval, and whether they agree: each run's median inside the other's interval. Then the
verdicts: the categorical claims (no numbers) must be the same in both runs. Exit status 0 when
every median agrees and every claim matches, 1 otherwise.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ...errors import ConfigurationError

__all__ = ["load_results", "compare_runs", "compare_main"]

_KEY = ("model", "scaling", "backend", "launcher", "processes")
FIGURES = {"step_ms_median": "step ms", "samples_per_s": "samples/s"}


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


def _interval(row: dict, key: str) -> tuple:
    return row.get(key), row.get(f"{key}_low"), row.get(f"{key}_high")


def _inside(value, low, high) -> bool:
    return value is not None and low is not None and high is not None and low <= value <= high


def _default(row: dict) -> bool:
    """Default settings only: a tuned row's setting may differ between runs."""
    return row.get("setting", "default") == "default"


def compare_runs(a: dict, b: dict) -> dict:
    """{"rows": [...], "claims": {"same": [...], "only_a": [...], "only_b": [...]}, "agree": bool}."""
    rows_b = {tuple(r.get(k) for k in _KEY): r for r in b["tables"]["training"] if _default(r)}
    rows = []
    for ra in a["tables"]["training"]:
        rb = rows_b.get(tuple(ra.get(k) for k in _KEY))
        if rb is None or not _default(ra):
            continue
        entry = {k: ra.get(k) for k in _KEY}
        for key in FIGURES:
            (va, la, ha), (vb, lb, hb) = _interval(ra, key), _interval(rb, key)
            entry[key] = {"a": [va, la, ha], "b": [vb, lb, hb], "agree": _inside(vb, la, ha) and _inside(va, lb, hb)}
        rows.append(entry)
    claims_a = [v["claim"] for v in a.get("verdict", [])]
    claims_b = [v["claim"] for v in b.get("verdict", [])]
    claims = {
        "same": [c for c in claims_a if c in claims_b],
        "only_a": [c for c in claims_a if c not in claims_b],
        "only_b": [c for c in claims_b if c not in claims_a],
    }
    agree = all(e[k]["agree"] for e in rows for k in FIGURES) and not claims["only_a"] and not claims["only_b"]
    return {"rows": rows, "claims": claims, "agree": agree and bool(rows)}


def _cell(value, low, high) -> str:
    if value is None:
        return "—"
    if low is None or high is None:
        return f"{value:g}"
    return f"{value:g} [{low:g}–{high:g}]"


def report(a_name: str, b_name: str, result: dict) -> str:
    """The comparison as Markdown: the medians table, then the verdicts."""
    head = ["model", "scaling", "backend", "launcher", "procs"]
    for label in FIGURES.values():
        head += [f"{label} A", f"{label} B", "agree"]
    lines = [f"A = {a_name}, B = {b_name}; medians over launches with 95% intervals", ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in result["rows"]:
        cells = [str(e[k]) for k in _KEY]
        for key in FIGURES:
            cells += [_cell(*e[key]["a"]), _cell(*e[key]["b"]), "yes" if e[key]["agree"] else "NO"]
        lines.append("| " + " | ".join(cells) + " |")
    claims = result["claims"]
    lines += ["", f"Verdicts: {len(claims['same'])} identical in both runs"]
    lines += [f"- only in A: {c}" for c in claims["only_a"]]
    lines += [f"- only in B: {c}" for c in claims["only_b"]]
    disagree = sum(not e[k]["agree"] for e in result["rows"] for k in FIGURES)
    lines += [
        "",
        f"{'AGREE' if result['agree'] else 'DISAGREE'}: {disagree} median(s) outside the other run's interval, "
        f"{len(claims['only_a']) + len(claims['only_b'])} verdict(s) differ.",
    ]
    return "\n".join(lines)


def compare_main(path_a: str, path_b: str, out=None) -> int:
    """Print the comparison of two results folders; exit status 0 when they agree."""
    result = compare_runs(load_results(path_a), load_results(path_b))
    print(report(path_a, path_b, result), file=out or sys.stdout)
    return 0 if result["agree"] else 1
