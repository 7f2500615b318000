"""Student's t tail and quantile (from scipy), Welch's degrees of freedom and Holm's step-down
adjustment: whether two figures differ, and by how much."""

from __future__ import annotations

import functools
import math

from scipy import stats

__all__ = ["two_sided_p", "t_quantile", "welch", "holm"]


def two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with `df` degrees of freedom (inf: the normal)."""
    return float(2.0 * stats.t.sf(abs(t), df))


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


def holm(p_values: list) -> list:
    """Holm's step-down adjusted p-values (family-wise error control, any dependence)."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [1.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
