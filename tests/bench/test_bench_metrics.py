"""Benchmark formulas and option parsing against hand-computed numbers."""

import pytest
import torch

from paraflow.bench.driver.config import BenchConfig, message_sizes, parse_size
from paraflow.bench.model_spec import ModelSpec
from paraflow.bench.rank.sweep import count_wrong, expected, iterations_for, pattern
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


def test_a_step_takes_as_long_as_its_slowest_rank():
    assert metrics.slowest_rank_per_step([[1.0, 5.0, 2.0], [3.0, 1.0, 2.0]]) == [3.0, 5.0, 2.0]
    assert metrics.slowest_rank_per_step([]) == []
    with pytest.raises(ValueError, match="different numbers of steps"):
        metrics.slowest_rank_per_step([[1.0, 2.0], [1.0]])


def test_throughput_and_scaling():
    assert metrics.throughput(640, 2.0) == 320.0
    with pytest.raises(ValueError):
        metrics.throughput(10, 0.0)


def test_communication_overhead():
    assert metrics.communication_overhead(t_no_sync=3.0, t_sync=4.0) == pytest.approx(0.25)
    assert metrics.communication_overhead(4.0, 4.0) == 0.0


def test_bandwidths_follow_nccl_tests():
    assert metrics.bus_factor(1) == 0.0 and metrics.bus_factor(2) == 1.0 and metrics.bus_factor(4) == 1.5
    assert metrics.bus_factor(4, "allgather") == 0.75 and metrics.bus_factor(4, "reduce_scatter") == 0.75
    assert metrics.bus_factor(8, "broadcast") == 1.0
    with pytest.raises(ValueError):
        metrics.bus_factor(2, "alltoall")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_sweep_check_patterns_are_exact_and_count_wrong_elements(dtype):
    n, count = 3, 30
    rows = [pattern(r, count, dtype) for r in range(n)]
    assert rows[2].tolist() == [3.0 * (i % 13 + 1) for i in range(count)] and rows[2].is_contiguous()
    total = sum(rows)
    assert torch.equal(total, expected("allreduce", n, 0, count, dtype))
    assert expected("allreduce", n, 0, count, dtype)[:3].tolist() == [6.0, 12.0, 18.0]  # 1+2+3 times (i % 13 + 1)
    assert torch.equal(expected("allgather", n, 1, count, dtype), torch.cat(rows))
    assert torch.equal(expected("broadcast", n, 2, count, dtype), rows[0])
    # reduce_scatter: each rank's input has count * n elements; rank r keeps chunk r of the sum
    inputs = [pattern(r, count * n, dtype) for r in range(n)]
    assert torch.equal(expected("reduce_scatter", n, 1, count, dtype), sum(inputs)[count : 2 * count])
    bad = expected("allreduce", n, 0, count, dtype).clone()
    bad[[0, 5]] += 1
    assert count_wrong(bad, expected("allreduce", n, 0, count, dtype)) == 2
    assert count_wrong(bad[:10], expected("allreduce", n, 0, count, dtype)) == count  # wrong shape: all wrong
    assert count_wrong(rows, expected("allgather", n, 0, count, dtype)) == 0  # a list is concatenated
    assert count_wrong(rows[::-1], expected("allgather", n, 0, count, dtype)) > 0  # ranks out of order


def test_iterations_scale_with_size():
    assert iterations_for(256 * 1024**2) == 4 and iterations_for(2**40) == 4
    assert iterations_for(4096) == 40 and iterations_for(2**20 - 1) == 40  # below 1 MB latency sets the time
    assert iterations_for(2**20) == 200 and iterations_for(4 * 2**20) == 64


def test_sizes_parse_like_nccl_tests():
    assert parse_size("4K") == 4096 and parse_size("64M") == 64 * 1024**2 and parse_size("1024") == 1024
    assert parse_size("1g") == 1024**3
    assert message_sizes(4096, 65536) == [4096, 16384, 65536]
    assert message_sizes(4096, 64 * 1024**2)[-1] == 64 * 1024**2
    for bad in ("4X", "", "-1", "4.5M"):
        with pytest.raises(ConfigurationError, match="message size"):
            parse_size(bad)
    with pytest.raises(ConfigurationError):
        message_sizes(4096, 1024)


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
    assert BenchConfig().nprocs == [1, 2] and BenchConfig().models[0] == ModelSpec("mlp", (("width", 1024),))
    with pytest.raises(ConfigurationError, match="--nprocs 1,2"):
        BenchConfig(nprocs=[0])
    with pytest.raises(ConfigurationError, match="unknown data"):
        BenchConfig(data="imagenet")
    with pytest.raises(ConfigurationError, match="steps=0"):
        BenchConfig(steps=0)
    with pytest.raises(ConfigurationError, match="timeout"):
        BenchConfig(timeout=0)
    with pytest.raises(ConfigurationError, match="repeat=0"):
        BenchConfig(repeat=0)
    with pytest.raises(ConfigurationError, match="threads=0"):
        BenchConfig(threads=0)
    with pytest.raises(ConfigurationError, match="--collectives allreduce"):
        BenchConfig(collectives=["alltoall"])
    with pytest.raises(ConfigurationError, match="does not divide by 3"):
        BenchConfig(scaling=["strong"], nprocs=[1, 2, 3], batch_size=32)
