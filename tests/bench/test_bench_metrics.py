"""Benchmark formulas and option parsing against hand-computed numbers."""

import pytest

from paraflow.bench.driver.config import BenchConfig, ModelSpec, message_sizes, parse_size
from paraflow.bench.rank.allreduce import count_wrong, expected_sum, iterations_for, pattern
from paraflow.bench.report import metrics
from paraflow.errors import ConfigurationError


def test_percentile_interpolates_linearly_like_numpy():
    values = [4.0, 1.0, 3.0, 2.0]
    assert metrics.percentile(values, 0) == 1.0 and metrics.percentile(values, 100) == 4.0
    assert metrics.percentile(values, 10) == pytest.approx(1.3)  # pos 0.3 between 1 and 2
    assert metrics.percentile(values, 90) == pytest.approx(3.7)
    assert metrics.percentile(values, 50) == pytest.approx(2.5)
    assert metrics.percentile([7.0], 90) == 7.0
    with pytest.raises(ValueError):
        metrics.percentile([], 50)


def test_step_summary_is_median_and_p10_p90():
    s = metrics.step_summary([0.01, 0.05, 0.02, 0.03, 0.04])
    assert s == pytest.approx({"median": 0.03, "p10": 0.014, "p90": 0.046})


def test_a_step_takes_as_long_as_its_slowest_rank():
    assert metrics.slowest_rank_per_step([[1.0, 5.0, 2.0], [3.0, 1.0, 2.0]]) == [3.0, 5.0, 2.0]
    assert metrics.slowest_rank_per_step([]) == []
    with pytest.raises(ValueError, match="different numbers of steps"):
        metrics.slowest_rank_per_step([[1.0, 2.0], [1.0]])


def test_throughput_and_scaling():
    assert metrics.throughput(640, 2.0) == 320.0
    with pytest.raises(ValueError):
        metrics.throughput(10, 0.0)
    assert metrics.weak_scaling_efficiency(x_n=300.0, n=2, x_1=200.0) == pytest.approx(0.75)
    assert metrics.strong_scaling(t_1=8.0, t_n=2.5, n=4) == pytest.approx((3.2, 0.8))


def test_overheads():
    assert metrics.communication_overhead(t_no_sync=3.0, t_sync=4.0) == pytest.approx(0.25)
    assert metrics.communication_overhead(4.0, 4.0) == 0.0
    assert metrics.abstraction_overhead(t_paraflow=10.1, t_raw=10.0) == pytest.approx(0.01)
    assert metrics.abstraction_overhead(9.9, 10.0) == pytest.approx(-0.01)


def test_median_confidence_interval_uses_order_statistics():
    values = [float(v) for v in range(11, 0, -1)]  # 11..1, unsorted on purpose
    # n = 11: k = floor((11 - 1.96 * sqrt(11)) / 2) = floor(2.25) = 2 -> 3rd and 9th smallest
    assert metrics.median_confidence_interval(values) == (3.0, 9.0)
    assert metrics.median_confidence_interval([5.0, 1.0, 3.0]) == (1.0, 5.0)  # too few: min, max
    n100 = metrics.median_confidence_interval(list(range(100)))
    assert n100 == (40, 59)  # k = floor((100 - 19.6) / 2) = 40
    with pytest.raises(ValueError):
        metrics.median_confidence_interval([])


def test_bandwidths_follow_nccl_tests():
    assert metrics.algbw(1_000_000_000, 2.0) == 5e8
    assert metrics.bus_factor(1) == 0.0 and metrics.bus_factor(2) == 1.0 and metrics.bus_factor(4) == 1.5
    assert metrics.busbw(1_000_000_000, 2.0, 4) == pytest.approx(7.5e8)
    assert metrics.busbw(4096, 0.001, 8) == pytest.approx(4096 / 0.001 * 14 / 8)
    assert metrics.mean([1.0, 2.0, 6.0]) == 3.0 and metrics.mean([]) is None


def test_allreduce_check_pattern_is_exact_and_counts_wrong_elements():
    import torch

    n, count = 3, 30
    total = sum(pattern(r, count) for r in range(n))
    assert torch.equal(total, expected_sum(n, count))
    assert expected_sum(n, count)[:3].tolist() == [6.0, 12.0, 18.0]  # 1+2+3 times (i % 13 + 1)
    bad = expected_sum(n, count).clone()
    bad[[0, 5]] += 1
    assert count_wrong(bad, expected_sum(n, count)) == 2
    assert count_wrong(bad[:10], expected_sum(n, count)) == count  # wrong shape: all wrong
    assert iterations_for(64 * 1024**2) == 4 and iterations_for(4096) == 20 and iterations_for(2**40) == 3


def test_sizes_parse_like_nccl_tests():
    assert parse_size("4K") == 4096 and parse_size("64M") == 64 * 1024**2 and parse_size("1024") == 1024
    assert parse_size("1g") == 1024**3
    assert message_sizes(4096, 65536, 4) == [4096, 16384, 65536]
    assert message_sizes(4096, 64 * 1024**2, 2)[-1] == 64 * 1024**2
    for bad in ("4X", "", "-1", "4.5M"):
        with pytest.raises(ConfigurationError, match="message size"):
            parse_size(bad)
    with pytest.raises(ConfigurationError):
        message_sizes(4096, 1024, 2)
    with pytest.raises(ConfigurationError):
        message_sizes(4096, 8192, 1)


def test_model_specs():
    spec = ModelSpec.parse("transformer:width=32,depth=1")
    assert spec.name == "transformer" and spec.kwargs == {"width": 32, "depth": 1}
    assert str(spec) == "transformer:width=32,depth=1" and spec.label == "transformer(width=32,depth=1)"
    assert ModelSpec.parse(str(spec)) == spec and ModelSpec.parse("cnn").label == "cnn"
    with pytest.raises(ConfigurationError, match="unknown model 'resnet'"):
        ModelSpec.parse("resnet")
    with pytest.raises(ConfigurationError, match="key=<integer>"):
        ModelSpec.parse("mlp:width")


def test_config_refuses_bad_values_with_the_fix():
    assert BenchConfig().nprocs == [1, 2] and BenchConfig().overhead_model == ModelSpec("mlp", (("width", 1024),))
    with pytest.raises(ConfigurationError, match="--nprocs 1,2"):
        BenchConfig(nprocs=[0])
    with pytest.raises(ConfigurationError, match="unknown data"):
        BenchConfig(data="imagenet")
    with pytest.raises(ConfigurationError, match="steps=0"):
        BenchConfig(steps=0)
    with pytest.raises(ConfigurationError, match="timeout"):
        BenchConfig(timeout=0)
