"""How often a rerun's median lies inside a correct 95% interval, when nothing changed.

    python benchmarks/agreement_odds.py                 # 3, 5, 10 and 30 launches, 200,000 pairs
    python benchmarks/agreement_odds.py --launches 3 --pairs 20000

Each simulated run measures one figure over `launches` launches whose log values are independent
standard normals (the same true value in both runs). Its interval is the one `paraflow bench`
reports (Student's t across launches on the log scale, intervals.across_launches) and its value
the median over launches. It prints how often run B's median lies inside run A's interval (one
way) and how often each run's median lies inside the other's (both ways, what `paraflow bench
compare` calls *agree*).
"""

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from paraflow.bench.report.intervals import CONFIDENCE  # noqa: E402
from paraflow.bench.report.student import t_quantile  # noqa: E402


def runs(launches: int, pairs: int, gen: torch.Generator) -> tuple:
    """(value, low, high) of `pairs` simulated runs, on the log scale: median over launches and
    the t interval of their mean."""
    logs = torch.randn(pairs, launches, generator=gen, dtype=torch.float64)
    centre, half = logs.mean(dim=1), t_quantile(launches - 1, CONFIDENCE) * logs.std(dim=1) / math.sqrt(launches)
    value = logs.exp().quantile(0.5, dim=1).log()  # the usual median of the figures themselves
    return value, centre - half, centre + half


def agreement_odds(launches: int, pairs: int, seed: int = 0) -> tuple:
    """(one way, both ways): the share of pairs of runs whose medians lie inside the other's interval."""
    gen = torch.Generator().manual_seed(seed)
    (va, la, ha), (vb, lb, hb) = runs(launches, pairs, gen), runs(launches, pairs, gen)
    one = (la <= vb) & (vb <= ha)
    both = one & (lb <= va) & (va <= hb)
    return float(one.double().mean()), float(both.double().mean())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--launches", type=int, nargs="+", default=[3, 5, 10, 30], help="launches per run")
    parser.add_argument("--pairs", type=int, default=200_000, help="simulated pairs of runs")
    args = parser.parse_args(argv)
    print("launches | one way | both ways | all of 27 rows both ways")
    for n in args.launches:
        one, both = agreement_odds(n, args.pairs)
        print(f"{n:8d} | {one:7.1%} | {both:9.1%} | {both**27:.2g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
