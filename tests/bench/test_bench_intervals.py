"""Intervals, verdicts and the two-run comparison against hand-computed inputs."""

import math

import pytest
import torch

from paraflow.bench.report import intervals
from paraflow.bench.report.tables import format_cell
from paraflow.bench.report.verdict import compare_pair, training_verdict


def test_block_medians_split_in_order():
    def block_medians(values, count):
        return intervals.blocks(torch.tensor(values, dtype=torch.float64), "median", count).tolist()

    assert block_medians([1, 9, 2, 8, 3, 7], 3) == [5.0, 5.0, 5.0]
    assert block_medians([1, 2, 3, 10, 20, 30], 2) == [2.0, 20.0]
    assert block_medians([4.0], 20) == [4.0]


@pytest.mark.parametrize("statistic", ["median", "mean"])
def test_long_windows_resample_blocks_of_consecutive_steps(statistic):
    """Past MAX_POINTS steps a launch is cut into blocks; each block's median or mean is resampled."""
    steps = [1.0] * 300 + [3.0] * 300  # 600 steps: 200 blocks of 3, the first 100 at 1, the rest at 3
    units = intervals.blocks(torch.tensor(steps, dtype=torch.float64), statistic)
    assert units.tolist() == [1.0] * 100 + [3.0] * 100
    est = intervals.estimate([steps], statistic, "long window", statistic)  # one launch: its steps alone
    assert est.value == 2.0 and est.low < 2.0 < est.high


def test_identical_launches_give_a_zero_width_interval():
    est = intervals.estimate([[2.0, 2.0, 2.0]] * 3, "median", "same")
    assert (est.value, est.low, est.high) == (2.0, 2.0, 2.0) and est.halfwidth == 0.0


def test_the_value_is_the_median_over_launches_and_the_interval_covers_their_spread():
    launches = [[1.0, 1.1, 0.9, 1.0], [2.0, 2.1, 1.9, 2.0], [3.0, 3.1, 2.9, 3.0]]
    est = intervals.estimate(launches, "median", "spread")
    assert est.value == 2.0  # launch medians 1.0, 2.0, 3.0
    # a replicate draws 3 launches with replacement: all three from launch 1 has probability 1/27 > 2.5%
    assert est.low <= 1.0 and est.high >= 3.0
    again = intervals.estimate(launches, "median", "spread")
    assert (again.low, again.high) == (est.low, est.high)  # seeded by what is estimated: reproducible


def test_derived_estimates_carry_their_replicates():
    a = intervals.Estimate(10.0, 9.0, 11.0, torch.full((100,), 10.0, dtype=torch.float64))
    b = intervals.Estimate(5.0, 4.0, 6.0, torch.full((100,), 5.0, dtype=torch.float64))
    ratio = a.map(lambda x, y: x / y, b)
    assert (ratio.value, ratio.low, ratio.high) == (2.0, 2.0, 2.0)
    assert intervals.relative_halfwidth(10.0, 9.0, 12.0) == pytest.approx(0.2)
    assert math.isinf(intervals.relative_halfwidth(0.0, -1.0, 1.0))


def test_a_ratio_of_two_launch_figures_has_welchs_interval_on_the_log_scale():
    """Equal spreads over 3 launches each: Welch-Satterthwaite gives 4 degrees of freedom, so the
    95% interval of the log ratio is its centre +- 2.776 sqrt(2) s / sqrt(3). Dividing the two
    estimates' own t(2) draws instead put it about 6.5 standard errors out."""
    fast = intervals.estimate([[1000.0] * 5, [1100.0] * 5, [1050.0] * 5], "median", "welch fast")
    slow = intervals.estimate([[500.0] * 5, [550.0] * 5, [525.0] * 5], "median", "welch slow")
    logs = torch.tensor([1000.0, 1100.0, 1050.0], dtype=torch.float64).log()
    half = 2.776 * math.sqrt(2) * float(logs.std()) / math.sqrt(3)
    factor = intervals.ratio(fast, slow)
    assert factor.value == pytest.approx(2.0) and factor.log_t[2] == pytest.approx(4.0)
    assert math.log(factor.low) == pytest.approx(math.log(2) - half, abs=1e-4)
    assert math.log(factor.high) == pytest.approx(math.log(2) + half, abs=1e-4)
    drawn = fast.map(lambda x, y: x / y, slow)  # the two heavy tails added
    assert math.log(drawn.high / 2) > 1.4 * half
    scaled = intervals.ratio(fast, slow, 0.5)  # an efficiency: x_n / (n x_1)
    assert (scaled.value, scaled.low, scaled.high) == pytest.approx((1.0, factor.low / 2, factor.high / 2))
    itself = intervals.ratio(fast, fast, 0.5)  # the baseline against itself
    assert (itself.value, itself.low, itself.high) == (0.5, 0.5, 0.5)


def test_the_ratio_of_two_equal_figures_holds_1_95_percent_of_the_time():
    """Two cells with the same true throughput, 3 launches each: the ratio's interval must hold 1
    about 95% of the time (dividing draws of each figure's own t held it about 99.6% of the time,
    so that rows 5-10% apart were called ties)."""
    g = torch.Generator().manual_seed(11)
    trials, covered = 400, 0
    for trial in range(trials):
        a, b = (torch.exp(torch.randn(3, generator=g, dtype=torch.float64) * 0.1) * 1000.0 for _ in range(2))
        ea = intervals.estimate([[float(v)] * 5 for v in a], "median", "equal a", trial)
        eb = intervals.estimate([[float(v)] * 5 for v in b], "median", "equal b", trial)
        factor = intervals.ratio(ea, eb)
        covered += factor.low <= 1.0 <= factor.high
    assert 0.92 <= covered / trials <= 0.98


def launches(center: float, spread: float, n: int = 3, steps: int = 30) -> list:
    """n launches of `steps` values around `center`, each launch shifted by up to `spread`."""
    g = torch.Generator().manual_seed(int(center * 1000))
    out = []
    for i in range(n):
        shift = center * spread * (i - (n - 1) / 2) / max(1, (n - 1) / 2)
        noise = torch.rand(steps, generator=g, dtype=torch.float64) * 0.02 * center
        out.append([float(v) for v in center + shift + noise])
    return out


def test_clearly_different_samples_give_a_verdict():
    fast = intervals.estimate(launches(1000.0, 0.02), "median", "fast")  # samples/s
    slow = intervals.estimate(launches(500.0, 0.02), "median", "slow")
    factor, significant = compare_pair(fast, slow)
    assert significant and factor.low > 1.8 and factor.high < 2.2


def test_overlapping_samples_give_no_significant_difference():
    a = intervals.estimate(launches(1000.0, 0.10), "median", "a")
    b = intervals.estimate(launches(1010.0, 0.10), "median", "b")
    first, second = (a, b) if a.value >= b.value else (b, a)
    factor, significant = compare_pair(first, second)
    assert not significant and factor.low <= 1.0 <= factor.high
    # a real but small difference inside the machine's noise floor is not called either
    c = intervals.estimate([[1000.0] * 5] * 3, "median", "c")
    d = intervals.estimate([[980.0] * 5] * 3, "median", "d")
    assert compare_pair(c, d)[1] and not compare_pair(c, d, threshold=0.05)[1]


def _row(backend, launcher, n=2, model="mlp", scaling="weak"):
    return {"backend": backend, "launcher": launcher, "processes": n, "model": model, "scaling": scaling}


def test_training_verdict_names_the_fastest_and_the_ties():
    x = {
        "a": intervals.estimate(launches(1000.0, 0.02), "median", "va"),
        "b": intervals.estimate(launches(1005.0, 0.02), "median", "vb"),
        "c": intervals.estimate(launches(400.0, 0.02), "median", "vc"),
    }
    comm = intervals.Estimate(0.4, 0.35, 0.45)
    rows = [_row("ddp-gloo", "torchrun"), _row("horovod", "mpirun"), _row("horovod", "horovodrun")]
    ests = [{"x": x["a"], "comm": comm}, {"x": x["b"], "comm": comm}, {"x": x["c"], "comm": None}]
    (entry,) = training_verdict(rows, ests)
    assert entry["fastest"] == ["ddp-gloo · torchrun", "horovod · mpirun"]
    assert [s["name"] for s in entry["slower"]] == ["horovod · horovodrun"]
    assert entry["claim"] == (
        "mlp, 2 processes: fastest ddp-gloo · torchrun = horovod · mpirun; slower: horovod · horovodrun"
    )
    assert "no significant difference from" in entry["text"] and "faster than horovod · horovodrun" in entry["text"]
    assert "communication 40% [35%–45%] of its step" in entry["text"]


def test_a_significant_difference_below_the_margin_is_not_called():
    """2% apart, significantly: slower without a margin, tied with a 5% one (the larger of margin
    and noise floor decides); 25% apart stays slower either way."""
    x = {
        "a": intervals.estimate([[1000.0] * 5] * 3, "median", "ma"),
        "b": intervals.estimate([[980.0] * 5] * 3, "median", "mb"),
        "c": intervals.estimate([[800.0] * 5] * 3, "median", "mc"),
    }
    rows = [_row("ddp-gloo", "torchrun"), _row("horovod", "mpirun"), _row("fsdp", "torchrun")]
    ests = [{"x": x["a"]}, {"x": x["b"]}, {"x": x["c"]}]
    (strict,) = training_verdict(rows, ests)
    assert strict["fastest"] == ["ddp-gloo · torchrun"] and strict["threshold"] == 0.0
    assert [s["name"] for s in strict["slower"]] == ["horovod · mpirun", "fsdp · torchrun"]
    for floor, margin in ((0.0, 0.05), (0.05, 0.01)):
        (entry,) = training_verdict(rows, ests, noise_floor=floor, margin=margin)
        assert entry["threshold"] == 0.05
        tie = "fastest ddp-gloo · torchrun = horovod · mpirun; slower: fsdp · torchrun"
        assert entry["claim"] == f"mlp, 2 processes: {tie}"
        assert "a difference below 5% from horovod · mpirun (1.02×" in entry["text"]
        assert "1.25× [" in entry["text"] and "faster than fsdp · torchrun" in entry["text"]


def test_cells_show_their_intervals_and_the_noisy_mark():
    row = {"step_ms_median": 9.08, "step_ms_median_low": 8.8, "step_ms_median_high": 9.44, "noisy": "no"}
    assert format_cell("step_ms_median", row) == "9.08 ±4.0%"
    row.update(step_ms_median_high=11.0, noisy="step")
    assert format_cell("step_ms_median", row) == "9.08 ±21% noisy"
    comm = {"comm_overhead": 0.421, "comm_overhead_low": 0.38, "comm_overhead_high": 0.473}
    assert format_cell("comm_overhead", comm) == "42.1% [38.0–47.3]"
    error = {"prediction_error": 0.002, "prediction_error_low": -0.004, "prediction_error_high": 0.008}
    assert format_cell("prediction_error", error) == "+0.20% [-0.40, +0.80]"
    assert format_cell("samples_per_s", {"samples_per_s": 12.0}) == "12"


def test_the_interval_across_three_launches_covers_the_true_median_95_percent_of_the_time():
    """Launch figures from a known log-normal: the 95% interval must hold its median about 95% of the
    time (a percentile bootstrap over 3 launches spans their extremes, which hold it 75% of the time)."""
    g = torch.Generator().manual_seed(7)
    trials, covered = 400, 0
    for trial in range(trials):
        medians = torch.exp(torch.randn(3, generator=g, dtype=torch.float64) * 0.2) * 10.0  # true median 10
        per_launch = [[float(m)] * 5 for m in medians]
        est = intervals.estimate(per_launch, "median", "coverage", trial)
        covered += est.low <= 10.0 <= est.high
    assert 0.92 <= covered / trials <= 0.98


def test_the_interval_across_launches_is_students_t_on_the_log_scale():
    est = intervals.estimate([[1.0] * 4, [2.0] * 4, [4.0] * 4], "median", "t")
    logs = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64).log()
    half = 4.302653 * float(logs.std()) / math.sqrt(3)  # t(2) 97.5% quantile
    center = float(logs.mean())
    assert est.value == 2.0
    assert math.log(est.low) == pytest.approx(center - half) and math.log(est.high) == pytest.approx(center + half)
    # its replicates are that t distribution: a derived figure's interval comes from them
    assert float(est.replicates.log().quantile(0.975)) == pytest.approx(center + half, rel=0.1)
    # a figure that can be zero or negative (comm overhead at one process) stays on the linear scale
    signed = intervals.estimate([[-0.1] * 3, [0.0] * 3, [0.1] * 3], "median", "signed")
    assert signed.low == pytest.approx(-4.302653 * 0.1 / math.sqrt(3))


def test_the_t_quantile_is_exact_at_any_launch_count():
    # 12 launches: t(11) = 2.200985, where a table of common df would round to a neighbour's
    values = [1.0 + 0.01 * i for i in range(12)]
    est = intervals.estimate([[v] * 3 for v in values], "median", "twelve")
    logs = torch.tensor(values, dtype=torch.float64).log()
    half = 2.200985 * float(logs.std()) / math.sqrt(12)
    assert math.log(est.high) - math.log(est.low) == pytest.approx(2 * half, rel=1e-5)


def test_a_figure_whose_steps_reach_zero_gets_a_linear_interval_not_an_exploding_log_one():
    """A residual part of the step (step - compute - communication - optimizer) is positive in each
    launch's median but some of its steps are not: on the log scale those steps' resampled medians
    near zero made intervals like ±6e15%. It stays on the linear scale, as a signed figure does."""
    launches = [[0.1, 0.12, 0.0, 0.11, 0.09], [0.08, 0.1, 0.0, 0.09, 0.1], [0.11, 0.09, -0.01, 0.1, 0.12]]
    est = intervals.estimate(launches, "median", "residual")
    assert 0.09 <= est.value <= 0.11
    assert math.isfinite(est.high) and est.high < 0.2 and est.low > 0.0
    points = torch.tensor([0.1, 0.09, 0.1], dtype=torch.float64)  # each launch's median
    assert est.low <= float(points.mean()) <= est.high


def test_the_results_definitions_name_the_interval_the_tables_use():
    """results.md's definitions say how every interval was made: the t interval across launches
    and its draws, not a method the code no longer uses."""
    from paraflow.bench.report.outputs import DEFINITIONS

    intervals_line = DEFINITIONS[0]
    assert "Student's t" in intervals_line and "log scale" in intervals_line
    assert f"{intervals.T_DRAWS} draws" in intervals_line and "Welch's t interval of the log ratio" in intervals_line
    assert "bootstrap interval of its steps" in intervals_line  # one launch: within-launch only
    assert "two-level" not in " ".join(DEFINITIONS)


def test_students_quantile_against_tabled_values():
    from paraflow.bench.report.intervals import t_quantile

    for df, t in [(1, 12.706), (2, 4.303), (4, 2.776), (10, 2.228), (60, 2.000), (1e9, 1.960)]:
        assert t_quantile(df) == pytest.approx(t, abs=1e-3)
    assert t_quantile(2) < t_quantile(1.5) < t_quantile(1)  # fractional degrees of freedom (Welch's)


def test_project_of_a_missing_folder_is_a_clear_error_not_a_traceback(tmp_path, capsys):
    from paraflow.cli import main

    assert main(["bench", "project", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "cannot read benchmark results" in err and "paraflow bench --out DIR" in err and "Traceback" not in err


def test_a_row_beaten_by_any_faster_row_is_slower_even_if_the_fastest_is_too_loose_to_show_it():
    loose = intervals.estimate(launches(1100.0, 0.60), "median", "loose")  # fastest by median, very wide
    tight = intervals.estimate(launches(1000.0, 0.01), "median", "tight")
    slow = intervals.estimate(launches(500.0, 0.01), "median", "slow")
    assert not compare_pair(loose, slow)[1] and compare_pair(tight, slow)[1]
    rows = [_row("horovod", "horovodrun"), _row("ddp-gloo", "torchrun"), _row("fsdp", "torchrun")]
    (entry,) = training_verdict(rows, [{"x": loose}, {"x": tight}, {"x": slow}])
    assert (
        entry["claim"]
        == "mlp, 2 processes: fastest ddp-gloo · torchrun = horovod · horovodrun; slower: fsdp · torchrun"
    )
    assert "fsdp · torchrun is slower than ddp-gloo · torchrun" in entry["text"]
