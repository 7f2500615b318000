"""The summary a run ends with, generated from its numbers: who is fastest, by how much, and what is noise.

Per model, scaling mode and process count the backends (with their launchers) are ranked by
throughput. A row is "slower" when some faster row beats it: the 95% interval of the ratio of
their throughputs (Welch's t on the log scale, across launches) lies above 1 (significant) and
the ratio exceeds 1 + the larger of the margin (default 5%) and the machine's noise floor (the
A/A spread: relevant); otherwise it shares the first place, with "no significant difference"
or "a difference below" the threshold. Each row's factor is given against the fastest by median.
Each entry has a `claim` (the categorical statement, no numbers: what a rerun should repeat) and
a `text` (the claim with its numbers).
"""

from __future__ import annotations

from typing import Optional

from . import intervals

__all__ = ["training_verdict", "compare_pair", "DEFAULT_MARGIN"]

#: The verdict calls a throughput difference only from this size up: two runs of one commit here
#: put the machine itself 0.3-3.7% apart (a fixed kernel timed after every launch), so a smaller one is
#: not what a rerun repeats.
DEFAULT_MARGIN = 0.05


def _name(row: dict) -> str:
    return f"{row['backend']} · {row['launcher']}" + (" · compiled" if row.get("compiled") == "yes" else "")


def compare_pair(fast: intervals.Estimate, slow: intervals.Estimate, threshold: float = 0.0) -> tuple:
    """(factor estimate fast / slow, called?): called when its interval (Welch's, on the log scale,
    for figures measured across launches) lies above 1 and the factor exceeds 1 + `threshold`
    (the larger of the margin and the A/A spread)."""
    factor = intervals.ratio(fast, slow)
    return factor, factor.low > 1.0 and factor.value > 1.0 + threshold


def _factor_text(est: intervals.Estimate) -> str:
    return f"{est.value:.2f}× [{est.low:.2f}–{est.high:.2f}]"


def _percent_text(est: intervals.Estimate) -> str:
    return f"{est.value:.0%} [{est.low:.0%}–{est.high:.0%}]"


def _beaten_by(slow: intervals.Estimate, faster: list, threshold: float) -> Optional[tuple]:
    """(name, factor text) of the first of the `faster` rows that beats `slow` beyond noise, else
    None: a row measured too loosely to beat anything (the fastest by its median, say) cannot
    hide a difference the other rows show."""
    for row, est in faster:
        factor, beats = compare_pair(est["x"], slow, threshold)
        if beats:
            return _name(row), _factor_text(factor)
    return None


def _group_verdict(model: str, scaling: str, n: int, entries: list, threshold: float) -> dict:
    """entries: (row, estimates) of one model, scaling and process count, each with a throughput."""
    entries = sorted(entries, key=lambda e: -e[1]["x"].value)
    fast_row, fast = entries[0]
    others = []
    for i, (row, est) in enumerate(entries[1:], start=1):
        factor, significant = compare_pair(fast["x"], est["x"], threshold)
        beaten_by = None if significant else _beaten_by(est["x"], entries[1:i], threshold)
        others.append(
            {
                "name": _name(row),
                "factor": factor.value,
                "low": factor.low,
                "high": factor.high,
                "slower": significant or beaten_by is not None,
                "beaten_by": beaten_by and beaten_by[0],
                "by": beaten_by and beaten_by[1],
            }
        )
    ties = sorted([_name(fast_row)] + [o["name"] for o in others if not o["slower"]])
    behind = sorted(o["name"] for o in others if o["slower"])
    where = f"{model}, {n} process{'es' * (n > 1)}" + (", strong scaling" if scaling == "strong" else "")
    claim = f"{where}: fastest {' = '.join(ties)}" + (f"; slower: {', '.join(behind)}" if behind else "")
    parts = [f"{where}: fastest {_name(fast_row)} ({fast['x'].value:,.0f} samples/s)"]
    for o in others:
        factor = _factor_text(intervals.Estimate(o["factor"], o["low"], o["high"]))
        if o["beaten_by"]:
            parts.append(f"{o['name']} is slower than {o['beaten_by']} ({o['by']}; {factor} against the fastest)")
        elif o["slower"]:
            parts.append(f"{factor} faster than {o['name']}")
        elif o["low"] > 1.0:  # significant, but not beyond the threshold
            parts.append(f"a difference below {threshold:.0%} from {o['name']} ({factor})")
        else:
            parts.append(f"no significant difference from {o['name']} ({factor})")
    if fast.get("comm") is not None:
        parts.append(f"communication {_percent_text(fast['comm'])} of its step")
    if len(entries) == 1:
        parts.append("nothing to compare with")
    return {
        "model": model,
        "scaling": scaling,
        "processes": n,
        "threshold": threshold,
        "fastest": ties,
        "first": _name(fast_row),
        "slower": [o for o in others if o["slower"]],
        "no_significant_difference": [o for o in others if not o["slower"]],
        "comm_overhead": None
        if fast.get("comm") is None
        else [fast["comm"].value, fast["comm"].low, fast["comm"].high],
        "claim": claim,
        "text": "; ".join(parts) + ".",
    }


def training_verdict(rows: list, estimates: list, noise_floor: float = 0.0, margin: float = 0.0) -> list:
    """One entry per model x scaling x process count with at least one measured row. A difference
    is called from 1 + max(`noise_floor`, `margin`) up."""
    threshold = max(noise_floor, margin)
    grouped: dict = {}
    for row, est in zip(rows, estimates):
        if est and est.get("x") is not None:
            grouped.setdefault((row["model"], row["scaling"], row["processes"]), []).append((row, est))
    return [_group_verdict(m, s, n, entries, threshold) for (m, s, n), entries in grouped.items()]
