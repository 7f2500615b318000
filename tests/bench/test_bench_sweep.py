"""The collective sweep on 2 real ranks: every result of every collective checked element by element."""

import pytest
from conftest import launch_ok, read_rank_json, requires_horovod

SIZES = "4096,65536"  # one small enough to travel inside paraflow's check, one not
COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "broadcast")


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "backend, launcher, refused",
    [("ddp-gloo", "torchrun", set()), pytest.param("horovod", "mpirun", {"bfloat16"}, marks=requires_horovod)],
)
def test_every_collective_is_exact_on_every_rank(backend, launcher, refused, tmp_path):
    script = ["-m", "paraflow.bench.rank.worker", "--out", tmp_path, "--backend", backend, "--sweep-sizes", SIZES]
    script += ["--collectives", ",".join(COLLECTIVES), "--dtypes", "float32,bfloat16"]
    launch_ok(launcher, 2, script, timeout=200)
    for result in read_rank_json(tmp_path, 2):
        sweep = result["tasks"]["sweep"]
        assert {u["dtype"] for u in sweep["unsupported"]} == refused
        rows = sweep["rows"]
        measured = {(r["collective"], r["impl"], r["dtype"], r["bytes"]) for r in rows}
        for dtype in {"float32", "bfloat16"} - refused:
            for size in (4096, 65536):
                for collective in COLLECTIVES:
                    assert (collective, "raw", dtype, size) in measured
                    public = (collective, "public", dtype, size) in measured
                    assert public == (collective != "reduce_scatter")  # paraflow has no public reduce_scatter
        assert all(r["wrong"] == 0 for r in rows), [r for r in rows if r["wrong"]]
        assert all(r["time_s"] > 0 and len(r["round_s"]) == 4 for r in rows)
