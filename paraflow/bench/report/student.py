"""Student's t distribution's two-sided tail and quantile, Welch's test and Holm's step-down
adjustment: enough to test whether two figures differ, without a statistics package."""

from __future__ import annotations

import functools
import math

__all__ = ["two_sided_p", "t_quantile", "welch", "holm"]


def _beta_fraction(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return result


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with `df` degrees of freedom."""
    if math.isinf(t):
        return 0.0
    return _incomplete_beta(df / 2, 0.5, df / (df + t * t))


@functools.lru_cache(maxsize=256)
def t_quantile(df: float, confidence: float = 0.95) -> float:
    """The t with P(|T| >= t) = 1 - `confidence` for Student's t with `df` (any positive real)
    degrees of freedom: the half-width of a `confidence` interval in standard errors."""
    tail, low, high = 1.0 - confidence, 0.0, 1.0
    while two_sided_p(high, df) > tail:
        high *= 2.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if two_sided_p(middle, df) > tail else (low, middle)
    return high


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
