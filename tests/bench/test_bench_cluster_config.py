"""`paraflow bench --nodes N --bandwidth RATE`: options checked up front, commands recorded per host."""

import pytest

from paraflow.bench.driver.config import BenchConfig
from paraflow.bench.driver.runner import command_line
from paraflow.errors import ConfigurationError


def test_a_cluster_run_has_one_rank_per_host():
    config = BenchConfig(cluster=3, bandwidth="1gbit", nprocs=[1, 2, 4])
    assert config.nprocs == [3]


@pytest.mark.parametrize(
    "options, fix",
    [({"bandwidth": "1gbit"}, "add --nodes 2"), ({"cluster": 1}, "2 or more hosts")],
)
def test_bad_cluster_options_say_how_to_fix_them(options, fix):
    with pytest.raises(ConfigurationError, match=fix):
        BenchConfig(**options)


def test_strong_scaling_checks_the_batch_against_the_host_count():
    """--nodes replaces the process counts, so the batch must divide by the hosts, not by --nprocs."""
    with pytest.raises(ConfigurationError, match="does not divide by 3"):
        BenchConfig(cluster=3, scaling=["strong"], batch_size=32)


def test_a_launch_on_several_hosts_is_recorded_as_commands_run_together():
    line = command_line([["paraflow", "cluster", "exec", "node0", "--", "a"], ["b c"]], {"X": "1", "Y": None})
    assert line == "env -u Y X=1 paraflow cluster exec node0 -- a & env -u Y X=1 'b c'"
