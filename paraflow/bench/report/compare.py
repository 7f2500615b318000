"""Two runs side by side: `paraflow bench compare RUN_A RUN_B`.

For every training row both runs have, the median step time and samples/s of each run with its
95% interval, and whether they agree: each run's median inside the other's interval. Then the
verdicts: the categorical claims (no numbers) must be the same in both runs. Exit status 0 when
every median agrees and every claim matches, 1 otherwise.

"Inside the other's interval" is a strict test: each interval holds the true value 95% of the
time, but the other run's median is itself noisy, and over dozens of figures some fall outside
by chance even when nothing changed. So each figure also gets Welch's t test of the two runs'
log values (their centres and standard errors recovered from the t intervals and launch counts),
and the p-values are adjusted for the number of figures (Holm): a figure *differs* when the
adjusted p-value is below 5%, which, when nothing changed, happens in at most 1 run pair in 20.

A machine that ran faster or slower during one run moves every figure alike, and launches within
one run cannot show it (they share it): the speed probe after every launch says how fast the
machine itself was in each run.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Optional

from ...errors import ConfigurationError
from .intervals import CONFIDENCE, holm, t_quantile, two_sided_p, welch
from .screen import interval_text

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


def _log_normal(value, low, high, launches) -> Optional[tuple]:
    """(centre, standard error, degrees of freedom) of a figure on the log scale, from its t interval."""
    if not (value and low and high) or min(value, low, high) <= 0:
        return None
    df = launches - 1 if launches and launches > 1 else 1000  # one launch: a bootstrap interval, ~normal
    half = (math.log(high) - math.log(low)) / 2
    return (math.log(low) + math.log(high)) / 2, half / t_quantile(df, CONFIDENCE), df


def welch_p(a: tuple, b: tuple) -> float:
    """Two-sided p-value of Welch's t test between two (centre, standard error, df) estimates."""
    difference, se, df = welch(a, b)
    if se == 0:
        return 0.0 if difference != 0 else 1.0
    return two_sided_p(difference / se, df)


def compare_runs(a: dict, b: dict) -> dict:
    """{"rows": [...], "claims": {"same": [...], "only_a": [...], "only_b": [...]}, "agree": bool,
    "consistent": bool (no figure differs at Holm-adjusted 5%), "differ": count}."""
    rows_b = {tuple(r.get(k) for k in _KEY): r for r in b["tables"]["training"]}
    rows = []
    for ra in a["tables"]["training"]:
        rb = rows_b.get(tuple(ra.get(k) for k in _KEY))
        if rb is None:
            continue
        entry = {k: ra.get(k) for k in _KEY}
        for key in FIGURES:
            (va, la, ha), (vb, lb, hb) = _interval(ra, key), _interval(rb, key)
            entry[key] = {
                "a": [va, la, ha],
                "b": [vb, lb, hb],
                "agree": _inside(vb, la, ha) and _inside(va, lb, hb),
            }
            ea, eb = _log_normal(va, la, ha, ra.get("launches")), _log_normal(vb, lb, hb, rb.get("launches"))
            entry[key]["p"] = welch_p(ea, eb) if ea and eb else None
        rows.append(entry)
    tested = [(e, k) for e in rows for k in FIGURES if e[k]["p"] is not None]
    for (e, k), adjusted in zip(tested, holm([e[k]["p"] for e, k in tested])):
        e[k]["p_holm"] = adjusted
        e[k]["differs"] = adjusted < 0.05
    claims_a = [v["claim"] for v in a.get("verdict", [])]
    claims_b = [v["claim"] for v in b.get("verdict", [])]
    claims = {
        "same": [c for c in claims_a if c in claims_b],
        "only_a": [c for c in claims_a if c not in claims_b],
        "only_b": [c for c in claims_b if c not in claims_a],
    }
    agree = all(e[k]["agree"] for e in rows for k in FIGURES) and not claims["only_a"] and not claims["only_b"]
    differ = sum(bool(e[k].get("differs")) for e in rows for k in FIGURES)
    return {
        "rows": rows,
        "claims": claims,
        "agree": agree and bool(rows),
        "consistent": not differ,
        "differ": differ,
        "probe": _probes(a, b),
    }


def _probes(a: dict, b: dict) -> Optional[dict]:
    """Both runs' machine speed probes (driver/runner.py's probe_ms) and B's median over A's, or None."""
    pa, pb = (run.get("header", {}).get("speed_probe") for run in (a, b))
    if not pa or not pb:
        return None
    return {"a": pa, "b": pb, "ratio": pb["median_ms"] / pa["median_ms"]}


def report(a_name: str, b_name: str, result: dict) -> str:
    """The comparison as Markdown: the medians table, then the verdicts."""
    from tabulate import tabulate

    head = ["model", "scaling", "backend", "launcher", "procs"]
    for label in FIGURES.values():
        head += [f"{label} A", f"{label} B", "agree", "p (Holm)"]
    body = []
    for e in result["rows"]:
        cells = [str(e[k]) for k in _KEY]
        for key in FIGURES:
            p = e[key].get("p_holm")
            mark = "—" if p is None else f"{p:.2g}" + (" DIFFERS" if e[key]["differs"] else "")
            cells += [
                interval_text(*e[key]["a"]),
                interval_text(*e[key]["b"]),
                "yes" if e[key]["agree"] else "NO",
                mark,
            ]
        body.append(cells)
    lines = [f"A = {a_name}, B = {b_name}; medians over launches with 95% intervals", ""]
    lines += [tabulate(body, headers=head, tablefmt="github", disable_numparse=True)]
    claims = result["claims"]
    lines += ["", f"Verdicts: {len(claims['same'])} identical in both runs"]
    lines += [f"- only in A: {c}" for c in claims["only_a"]]
    lines += [f"- only in B: {c}" for c in claims["only_b"]]
    probe = result.get("probe")
    if probe:
        (a, b), ratio = (probe["a"], probe["b"]), probe["ratio"]
        pace = f"{abs(ratio - 1):.1%} {'slower' if ratio > 1 else 'faster'} than"
        pace = "as fast as" if abs(ratio - 1) < 0.0005 else pace
        lines += [
            "",
            f"Machine speed probe (the same fixed kernel after every launch): A median {a['median_ms']:g} ms "
            f"({a['min_ms']:g}–{a['max_ms']:g}), B median {b['median_ms']:g} ms ({b['min_ms']:g}–{b['max_ms']:g}): "
            f"during B the machine itself was {pace} during A.",
        ]
    disagree = sum(not e[k]["agree"] for e in result["rows"] for k in FIGURES)
    lines += [
        "",
        f"{'AGREE' if result['agree'] else 'DISAGREE'}: {disagree} median(s) outside the other run's interval, "
        f"{len(claims['only_a']) + len(claims['only_b'])} verdict(s) differ.",
        f"{'CONSISTENT' if result['consistent'] else 'DIFFERENT'}: {result['differ']} figure(s) differ between the "
        "runs by Welch's t test of their log values, Holm-adjusted over all figures at 5%.",
    ]
    return "\n".join(lines)


def compare_main(path_a: str, path_b: str, out=None) -> int:
    """Print the comparison of two results folders; exit status 0 when they agree."""
    result = compare_runs(load_results(path_a), load_results(path_b))
    print(report(path_a, path_b, result), file=out or sys.stdout)
    return 0 if result["agree"] else 1
