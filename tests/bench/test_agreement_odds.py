"""The README's odds that a rerun's median lies inside a correct interval (benchmarks/agreement_odds.py)."""

import importlib.util
import math
from pathlib import Path

import pytest
import torch

from paraflow.bench.report import intervals

_SPEC = importlib.util.spec_from_file_location(
    "agreement_odds", Path(__file__).resolve().parents[2] / "benchmarks" / "agreement_odds.py"
)
odds = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(odds)


@pytest.mark.parametrize("launches", [3, 4])
def test_the_simulated_runs_have_the_intervals_paraflow_reports(launches):
    gen = torch.Generator().manual_seed(1)
    logs = torch.randn(5, launches, generator=gen, dtype=torch.float64)
    values, lows, highs = odds.runs(launches, 5, torch.Generator().manual_seed(1))  # the same draws
    for i in range(5):
        est = intervals.across_launches([intervals.constant(math.exp(x)) for x in logs[i].tolist()], gen)
        assert math.log(est.value) == pytest.approx(float(values[i]))
        assert math.log(est.low) == pytest.approx(float(lows[i]))
        assert math.log(est.high) == pytest.approx(float(highs[i]))


def test_a_correct_interval_holds_a_reruns_median_both_ways_about_81_percent_of_the_time():
    one, both = odds.agreement_odds(3, 20_000)
    assert 0.88 < one < 0.91 and 0.795 < both < 0.825
    assert odds.agreement_odds(10, 20_000)[1] < both  # more launches do not raise it
