"""The collective sweep on 2 real ranks: every result of every collective checked element by element."""

import pytest
import torch
from conftest import launch_ok, read_rank_json, requires_horovod

SIZES = "4096,65536"  # one small enough to travel inside paraflow's check, one not
COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "broadcast")


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "backend, launcher", [("ddp-gloo", "torchrun"), pytest.param("horovod", "mpirun", marks=requires_horovod)]
)
def test_every_collective_is_exact_on_every_rank(backend, launcher, tmp_path):
    script = ["-m", "paraflow.bench.rank.worker", "--out", tmp_path, "--backend", backend, "--sweep-sizes", SIZES]
    script += ["--collectives", ",".join(COLLECTIVES)]
    launch_ok(launcher, 2, script, timeout=200)
    for result in read_rank_json(tmp_path, 2):
        sweep = result["tasks"]["sweep"]
        assert sweep["unsupported"] == []
        rows = sweep["rows"]
        measured = {(r["collective"], r["impl"], r["bytes"]) for r in rows}
        for size in (4096, 65536):
            for collective in COLLECTIVES:
                assert (collective, "raw", size) in measured
                public = (collective, "public", size) in measured
                assert public == (collective != "reduce_scatter")  # paraflow has no public reduce_scatter
        assert all(r["wrong"] == 0 for r in rows), [r for r in rows if r["wrong"]]
        assert all(r["time_s"] > 0 and len(r["round_s"]) == r["iters"] == rounds_for(r["bytes"]) for r in rows)


def rounds_for(size: int) -> int:
    from paraflow.bench.rank.sweep import ROUNDS, iterations_for

    return max(ROUNDS, iterations_for(size))


class _Recorder:
    """A one-rank stand-in for a backend and a raw library: records the order of the calls."""

    device, world_size, rank = torch.device("cpu"), 1, 0

    def __init__(self, calls: list) -> None:
        self.calls = calls

    def barrier(self) -> None:
        self.calls.append("barrier")

    def allreduce_(self, tensor, op="sum"):
        self.calls.append("public" if op == "sum" else op)
        return tensor


class _Raw(_Recorder):
    def allreduce_(self, tensor):
        self.calls.append("raw")
        return tensor


def test_sweep_warms_the_check_up_then_times_one_call_a_side_per_round_in_flipping_order():
    from paraflow.bench.rank.sweep import MIN_WARMUP, run_sweep

    calls: list = []
    size = 64 * 1024**2  # the fewest operations: the rounds' minimum decides
    result = run_sweep(_Recorder(calls), _Raw(calls), [size], ["allreduce"], rounds=5)
    timed = calls[calls.index("barrier") + 1 : -2]  # the last two: one checked call per side
    assert calls[: calls.index("barrier")] == ["raw"] * MIN_WARMUP + ["public"] * MIN_WARMUP
    assert timed == ["raw", "public", "public", "raw"] * 2 + ["raw", "public"]
    rows = result["rows"]
    assert [len(r["round_s"]) for r in rows] == [5, 5] and all(r["wrong"] == 0 for r in rows)
