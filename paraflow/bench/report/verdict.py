"""The summary a run ends with, generated from its numbers: who is fastest, by how much, and what is noise.

Per model, scaling mode and process count the backends (with their launchers) are ranked by
throughput. A row is "slower" when some faster row beats it: the 95% interval of the ratio of
their throughputs (Welch's t on the log scale, across launches) lies above 1 (significant) and
the ratio exceeds 1 + the larger of the margin (default 5%) and the machine's noise floor (the
A/A spread: relevant); otherwise it shares the first place, with "no significant difference"
or "a difference below" the threshold. Each row's factor is given against the fastest by median.
Each entry has a `claim` (the categorical statement, no numbers: what a rerun should repeat) and
a `text` (the claim with its numbers). The same for paraflow's collectives against the raw library's.
"""

from __future__ import annotations

from typing import Optional

from . import intervals

__all__ = ["training_verdict", "sweep_lines", "compare_pair", "RAW_TARGET_LARGE", "RAW_TARGET_SMALL", "DEFAULT_MARGIN"]

#: The verdict calls a throughput difference only from this size up: two runs of one commit here
#: put the machine itself 0.3-3.7% apart (a fixed kernel timed after every launch), so a smaller one is
#: not what a rerun repeats.
DEFAULT_MARGIN = 0.05

RAW_TARGET_LARGE = 1.10  # paraflow's collectives vs the raw library's, from 1 MB up
RAW_TARGET_SMALL = 1.50  # at the smallest size


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


def _meets(value: Optional[float], target: float, low: Optional[float] = None, high: Optional[float] = None) -> str:
    """yes when the interval lies at or below `target`, no when above it, "within noise" when it
    straddles it (only the median, without an interval)."""
    if value is None:
        return "—"
    if low is None or high is None:
        return "yes" if value <= target else "no"
    return "yes" if high <= target else ("no" if low > target else "within noise")


def sweep_lines(footers: list) -> list:
    """One entry per backend x launcher x collective with a raw comparison: paraflow's call
    within 1.1x of the raw library's from 1 MB up, and within 1.5x at the smallest size: yes when
    every interval lies at or below the target, no when one lies above, else within noise."""
    out = []
    for f in footers:
        if f.get("worst_vs_raw_large") is None and f.get("vs_raw_smallest") is None:
            continue
        where = f"{f['collective']}, {f['backend']} · {f['launcher']}, {f['processes']} processes"
        large, small = f["worst_vs_raw_large"], f["vs_raw_smallest"]
        large_meets = _meets(large, RAW_TARGET_LARGE, f.get("worst_vs_raw_large_low"), f.get("worst_vs_raw_large_high"))
        small_meets = _meets(small, RAW_TARGET_SMALL, f.get("vs_raw_smallest_low"), f.get("vs_raw_smallest_high"))
        claim = (
            f"{where}: paraflow within {RAW_TARGET_LARGE}× of raw at >= 1 MB: {large_meets}; "
            f"within {RAW_TARGET_SMALL}× at the smallest size: {small_meets}"
        )
        numbers = []
        if large is not None:
            numbers.append(f"worst {large:.2f}× at >= 1 MB")
        if small is not None:
            numbers.append(f"{small:.2f}× at the smallest size")
        out.append({"claim": claim, "text": f"{claim} ({', '.join(numbers)}; medians over launches)."})
    return out
