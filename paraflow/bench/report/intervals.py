"""95% confidence intervals for benchmark figures: across launches, and over paired steps.

Across launches (training and collective figures) the interval is Student's t interval of the
launches' own figures, on the log scale for positive figures (a timing varies by factors): the
launch is the unit that a rerun repeats (its start-up, its placement, the load of its minute),
and steps of one launch, alike for those reasons, would claim far too much. Its replicates are
draws of that t distribution, so a figure derived from several estimates (a ratio, an
efficiency) is computed replicate by replicate and carries the uncertainty of each. The point
value is the median over launches of each launch's own figure, so one disturbed launch cannot
move it much. Within a launch, steps are resampled (past MAX_POINTS steps, blocks of
consecutive steps): that bootstrap is the interval of a figure measured in one launch only.

A ratio of two such figures (one row's throughput over another's, an efficiency) has Welch's
interval on the log scale: the difference of the two t estimates' centres, its standard error and
the Welch-Satterthwaite degrees of freedom. Drawing each estimate's own t and dividing the draws
would add two heavy tails: for two 3-launch figures its 95% points lie 6.5 standard errors out
where Welch's lie 3.9 (a 99.6% interval called 95%).

Every draw comes from a generator seeded by what is estimated, so rebuilding the tables from
results.json gives the same intervals.

Student's t quantile comes from scipy; Welch's degrees of freedom say how far two figures differ.
"""

from __future__ import annotations

import functools
import math
import statistics
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from scipy import stats

__all__ = [
    "CONFIDENCE",
    "RESAMPLES",
    "Estimate",
    "generator",
    "student_t",
    "within_launch",
    "blocks",
    "across_launches",
    "estimate",
    "ratio",
    "relative_halfwidth",
    "t_quantile",
    "welch",
]

CONFIDENCE = 0.95
#: Bootstrap replicates per figure: enough for stable 2.5% / 97.5% percentiles.
RESAMPLES = 1000
#: Longer runs of steps are resampled in consecutive blocks (block medians or means), which also
#: keeps bursts of load that make neighbouring steps alike from narrowing the interval.
MAX_POINTS = 200


@dataclass(frozen=True)
class Estimate:
    """A figure with its 95% interval: `value` (median over launches), `low`, `high`, and the
    bootstrap replicates it came from (for figures derived from it, e.g. ratios)."""

    value: float
    low: float
    high: float
    replicates: Optional[torch.Tensor] = None
    log_t: Optional[tuple] = None  # (centre, standard error, degrees of freedom) of a t interval of its log

    @property
    def halfwidth(self) -> float:
        """The larger distance from the value to an end of the interval, relative to the value."""
        return relative_halfwidth(self.value, self.low, self.high)

    def map(self, function: Callable, *others: Estimate) -> Estimate:
        """The estimate of ``function(self, *others)``, applied to values and to replicates alike."""
        value = function(self.value, *(o.value for o in others))
        replicates = function(self.replicates, *(o.replicates for o in others))
        low, high = percentile_interval(replicates)
        return Estimate(value, min(low, value), max(high, value), replicates)


def relative_halfwidth(value: float, low: float, high: float) -> float:
    """max(value - low, high - value) / |value| (inf for a zero value)."""
    if value == 0:
        return math.inf if high != low else 0.0
    return max(value - low, high - value) / abs(value)


def generator(*key) -> torch.Generator:
    """A generator seeded by `key` (what is being estimated): same data, same interval."""
    g = torch.Generator()
    g.manual_seed(zlib.crc32(repr(key).encode()))
    return g


def blocks(values: torch.Tensor, statistic: str, count: int = MAX_POINTS) -> torch.Tensor:
    """`values` as `count` consecutive blocks' medians or means (unchanged when there are no more)."""
    n = values.numel()
    if n <= count:
        return values
    edges = [round(i * n / count) for i in range(count + 1)]
    parts = [values[a:b] for a, b in zip(edges, edges[1:])]
    return torch.tensor(
        [statistics.median(p.tolist()) if statistic == "median" else float(p.mean()) for p in parts],
        dtype=torch.float64,
    )


def within_launch(values: Sequence[float], statistic: str, gen: torch.Generator, resamples: int = RESAMPLES):
    """(point, replicates) of the median or mean of one launch's `values`, steps (or blocks of
    consecutive steps, past MAX_POINTS) drawn with replacement."""
    data = torch.tensor(list(values), dtype=torch.float64)
    if data.numel() == 0:
        raise ValueError("no values to resample")
    if statistic not in ("median", "mean"):
        raise ValueError(f"unknown statistic {statistic!r}")
    point = statistics.median(data.tolist()) if statistic == "median" else float(data.mean())
    units = blocks(data, statistic)
    drawn = units[torch.randint(units.numel(), (resamples, units.numel()), generator=gen)]
    return point, drawn.quantile(0.5, dim=1) if statistic == "median" else drawn.mean(dim=1)


#: Draws of the t distribution per estimate across launches (its derived figures' intervals are
#: percentiles of these: 8000 put the 2.5% and 97.5% points within a few percent of exact).
T_DRAWS = 8000


def student_t(df: int, size: int, gen: torch.Generator) -> torch.Tensor:
    """`size` draws of Student's t with `df` degrees of freedom: Z / sqrt(chi2_df / df)."""
    z = torch.randn(size, generator=gen, dtype=torch.float64)
    chi2 = (torch.randn(size, df, generator=gen, dtype=torch.float64) ** 2).sum(dim=1)
    return z / torch.sqrt(chi2 / df)


def across_launches(launches: Sequence[tuple], gen: torch.Generator) -> Estimate:
    """The median over launches of per-launch figures, with Student's t interval across launches.

    `launches` holds (point, replicates) per launch, replicates being that launch's within-launch
    bootstrap. With two or more launches the interval is the t interval of the launches' points,
    on the log scale when they and every replicate are positive (timings vary by factors):
    mean +- t(n-1) s / sqrt(n), s their standard deviation. Its replicates are draws of that t
    distribution (a parametric bootstrap), so figures derived from several estimates (ratios,
    efficiency) carry both estimates' uncertainty. The variance is at least the launches' mean
    within-launch bootstrap variance, so launches that agree by chance do not make a zero-width
    interval. A percentile bootstrap over so few launches cannot do this: with 3 it spans at most
    their extremes, which hold the median only 75% of the time. One launch: its own within-launch bootstrap (its steps
    alone, which say nothing of a rerun).
    """
    if not launches:
        raise ValueError("no launches")
    points = torch.tensor([p for p, _ in launches], dtype=torch.float64)
    value = statistics.median(points.tolist())
    count = points.numel()
    if count > 1:
        within = torch.stack([r for _, r in launches])  # each launch's own bootstrap
        # the log scale for figures that cannot reach zero: a residual such as the step's "other"
        # part, positive in every launch but not in all of its resampled steps, stays linear
        log = bool((points > 0).all()) and bool((within > 0).all())
        data = points.log() if log else points
        if log:
            within = within.log()
        # never narrower than the launches' own step-to-step uncertainty (3 launches can agree by chance)
        variance = max(float(data.var()), float(within.var(dim=1).mean()))
        center, spread = float(data.mean()), math.sqrt(variance / count)
        replicates = center + spread * student_t(count - 1, T_DRAWS, gen)
        half = t_quantile(count - 1, CONFIDENCE) * spread
        ends = torch.tensor([center - half, center + half])
        low, high = (ends.exp() if log else ends).tolist()
        replicates, log_t = (replicates.exp(), (center, spread, count - 1)) if log else (replicates, None)
        return Estimate(value, min(low, value), max(high, value), replicates, log_t)
    replicates = launches[0][1].repeat(T_DRAWS // launches[0][1].numel() + 1)[:T_DRAWS]
    low, high = percentile_interval(replicates)
    return Estimate(value, min(low, value), max(high, value), replicates)


def estimate(per_launch: Sequence[Sequence[float]], statistic: str, *key) -> Estimate:
    """Shortcut: the median over launches of each launch's `statistic` of its values, with its interval."""
    gen = generator(*key)
    return across_launches([within_launch(v, statistic, gen) for v in per_launch], gen)


def ratio(a: Estimate, b: Estimate, scale: float = 1.0) -> Estimate:
    """`scale` * a / b: the value from the two values (medians over launches); when both are t
    estimates of logs, Welch's 95% interval of the log ratio, with replicates drawn from that t
    (its degrees of freedom rounded down); otherwise replicate by replicate (`Estimate.map`)."""
    if a is b or a.log_t is None or b.log_t is None:  # a figure against itself: exactly `scale`
        return a.map(lambda x, y: scale * x / y, b)
    difference, se, df = welch(a.log_t, b.log_t)
    centre, value = difference + math.log(scale), scale * a.value / b.value
    if se == 0:
        low = high = math.exp(centre)
        replicates = torch.full((T_DRAWS,), low, dtype=torch.float64)
    else:
        half = t_quantile(df, CONFIDENCE) * se
        low, high = math.exp(centre - half), math.exp(centre + half)
        draws = student_t(max(1, int(df)), T_DRAWS, generator("ratio", a.log_t, b.log_t, scale))
        replicates = (centre + se * draws).exp()
    return Estimate(value, min(low, value), max(high, value), replicates, (centre, se, df))


def percentile_interval(replicates: torch.Tensor, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The middle `confidence` of the replicates (non-finite ones dropped)."""
    finite = replicates[torch.isfinite(replicates)]
    if finite.numel() == 0:
        return math.nan, math.nan
    tail = (1 - confidence) / 2
    q = torch.tensor([tail, 1 - tail], dtype=torch.float64)
    low, high = torch.quantile(finite, q).tolist()
    return low, high


@functools.lru_cache(maxsize=256)
def t_quantile(df: float, confidence: float = 0.95) -> float:
    """The t with P(|T| >= t) = 1 - `confidence` for Student's t with `df` (any positive real)
    degrees of freedom: the half-width of a `confidence` interval in standard errors."""
    return float(stats.t.ppf(1.0 - (1.0 - confidence) / 2.0, df))


def welch(a: tuple, b: tuple) -> tuple:
    """(difference, its standard error, Welch-Satterthwaite degrees of freedom) of two
    (centre, standard error, degrees of freedom) estimates; inf degrees of freedom when both
    standard errors are zero."""
    (ca, sa, da), (cb, sb, db) = a, b
    se2 = sa * sa + sb * sb
    df = se2 * se2 / ((sa**4) / da + (sb**4) / db) if se2 > 0 else math.inf
    return ca - cb, math.sqrt(se2), df
