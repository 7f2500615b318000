"""Table builders, matrix and failure summaries against hand-made per-rank numbers."""

import statistics
import time

import pytest

from paraflow.bench.driver.config import BenchConfig
from paraflow.bench.driver.matrix import Cell, build_matrix
from paraflow.bench.driver.runner import failure_reason, run_extra_launches, wide_groups
from paraflow.bench.report.tables import (
    SWEEP_COLUMNS,
    TRAINING_COLUMNS,
    build_tables,
    csv_columns,
    format_value,
    render,
)
from paraflow.errors import ConfigurationError


def train_task(step_s, window_s, losses, peak, batch=32, n=1, **extra):
    return {
        "model": "mlp",
        "model_spec": "mlp",
        "parameters": 1000,
        "grad_bytes": 4000,
        "batch_per_rank": batch,
        "samples_per_step": batch,
        "replicas": n,
        "scaling": "weak",
        "warmup": 7,
        "steps": len(step_s),
        "step_s": step_s,
        "window_s": window_s,
        "losses": losses,
        "peak_rss_bytes": peak,
        **extra,
    }


def cell(
    kind, backend, launcher, nproc, ranks, status="ok", error=None, sweep=False, models=("mlp",), repeat=1, tag=""
):
    group = f"{backend}-{launcher}-{nproc}{'-' + tag if tag else ''}"
    return {
        "id": f"{group}-r{repeat}" if repeat else group,
        "group": group,
        "repeat": repeat,
        "tag": tag,
        "kind": kind,
        "backend": backend,
        "launcher": launcher,
        "nproc": nproc,
        "threads": 1,
        "models": list(models),
        "sweep": sweep,
        "command": "cmd",
        "status": status,
        "error": error,
        "elapsed_s": 1.0,
        "ranks": ranks,
    }


def rank(r, n, tasks, transport="gloo"):
    return {"rank": r, "world_size": n, "transport": transport, "device": "cpu", "torch_threads": 1, "tasks": tasks}


def single(repeat, steps, window, tag=""):
    task = train_task(steps, window, [3.0, 2.0, 1.0][: len(steps)], 300e6)
    return cell("train", "single", "python", 1, [rank(0, 1, {"train/mlp": task}, "none")], repeat=repeat, tag=tag)


def sweep_row(collective, impl, size, rounds, wrong=0):
    return {
        "collective": collective,
        "impl": impl,
        "bytes": size,
        "count": size // 4,
        "iters": 8,
        "time_s": statistics.median(rounds),
        "round_s": rounds,
        "wrong": wrong,
    }


def ddp(repeat, scale):
    """Two ranks; rank 1 is the slower one in every step. `scale` stretches every time of the launch."""

    def t(values):
        return [v * scale for v in values]

    ranks = []
    for r, steps in ((0, [0.02, 0.04, 0.03]), (1, [0.03, 0.05, 0.04])):
        task = train_task(
            t(steps),
            0.15 * scale,
            [9.0, 1.0 + r, 7.0],
            300e6 + r * 10e6,
            n=2,
            loss_step=2,
            sync_pair_step_s=t([0.04, 0.06] if r else [0.05, 0.05]),
            no_sync_step_s=t([0.01, 0.02]),
        )
        sweep = {
            "world_size": 2,
            "device": "cpu",
            "rows": [
                sweep_row("allreduce", "raw", 4096, t([0.001, 0.002] if r else [0.002, 0.001]), wrong=r),
            ],
            "unsupported": [{"collective": "allgather", "error": "not supported"}],
        }
        ranks.append(rank(r, 2, {"train/mlp": task, "sweep": sweep}))
    return cell("train", "ddp-gloo", "torchrun", 2, ranks, sweep=True, repeat=repeat)


CELLS = [single(1, [0.010, 0.020, 0.030], 0.06), ddp(1, 1.0), single(2, [0.02, 0.04, 0.06], 0.12), ddp(2, 2.0)]
FAILED = cell(
    "train", "horovod", "mpirun", 2, [rank(0, 2, {})], status="timed out", error="timed out after 9 s", sweep=True
)


def test_training_rows_pool_launches_as_computed_by_hand():
    rows = build_tables(CELLS + [FAILED])["training"]
    assert [r["backend"] for r in rows] == ["single", "ddp-gloo", "horovod"]
    one, two, failed = rows
    assert set(TRAINING_COLUMNS) <= set(one) and one["launches"] == 2 and one["status"] == "ok"
    # single: launch medians 20 ms and 40 ms -> 30 ms; throughput 96 / 0.06 = 1600 and 96 / 0.12 = 800 -> 1200
    assert one["step_ms_median"] == 30.0 and one["samples_per_s"] == 1200.0
    assert one["step_ms_median_low"] <= 20.0 and one["step_ms_median_high"] >= 40.0  # covers both launches
    assert one["scaling_efficiency"] == 1.0 and one["comm_overhead"] is None
    # p10 / p90 pool the six steps 10, 20, 20, 30, 40, 60 ms
    assert (one["step_ms_p10"], one["step_ms_p90"]) == (15.0, 50.0)
    # ddp: slowest rank per step [30, 50, 40] ms, then twice that; launch medians 40 and 80 -> 60
    assert two["step_ms_median"] == 60.0 and two["global_batch"] == 64 and two["launches"] == 2
    # throughput 3 x 64 / 0.15 = 1280 and / 0.30 = 640 -> 960; efficiency 960 / (2 x 1200) = 0.4
    assert two["samples_per_s"] == 960.0 and two["samples_per_s_per_process"] == 480.0
    assert two["scaling_efficiency"] == 0.4
    # comm: slowest pairs sync [50, 60], no-sync [10, 20] ms: 1 - 15 / 55 in both launches (times scale alike)
    assert two["comm_overhead"] == round(1 - 0.015 / 0.055, 4)
    assert two["comm_overhead_low"] <= two["comm_overhead"] <= two["comm_overhead_high"]
    assert two["final_loss"] == 1.5 and two["peak_mem_mb"] == 310.0 and two["warmup_steps"] == 7
    assert failed["status"] == "timed out: timed out after 9 s" and failed["samples_per_s"] is None


def test_a_failed_launch_leaves_the_others_counted_and_says_so():
    broken = {**ddp(3, 1.0), "status": "failed", "error": "exit status 1: boom", "ranks": []}
    (_, two) = build_tables(CELLS + [broken])["training"]
    assert two["launches"] == 2 and two["step_ms_median"] == 60.0
    assert two["status"] == "ok (2 of 3 launches; launch 3: failed: exit status 1: boom)"


def test_strong_scaling_rows_use_the_same_global_batch():
    strong = ddp(1, 1.0)
    for r in strong["ranks"]:
        r["tasks"]["train-strong/mlp"] = {**r["tasks"]["train/mlp"], "scaling": "strong", "batch_per_rank": 16}
    rows = build_tables([single(1, [0.010, 0.020, 0.030], 0.06), strong], config={"scaling": ["weak", "strong"]})
    strong_rows = {r["backend"]: r for r in rows["training"] if r["scaling"] == "strong"}
    # single 20 ms, ddp 40 ms per step: speedup 0.5, efficiency 0.25 on 2 processes
    assert strong_rows["ddp-gloo"]["speedup"] == 0.5 and strong_rows["ddp-gloo"]["scaling_efficiency"] == 0.25
    assert strong_rows["single"]["speedup"] == 1.0


def test_sweep_rows_take_the_slowest_rank_per_round_and_pool_launches():
    tables = build_tables(CELLS + [FAILED])
    row, failed = tables["sweep"]
    assert set(row) >= set(SWEEP_COLUMNS) and failed["status"].startswith("timed out")
    # per round the slower rank: [2, 2] ms (launch 1), [4, 4] ms (launch 2) -> medians 2 and 4 -> 3 ms
    assert row["time_us"] == 3000.0 and row["impl"] == "raw"
    assert row["time_us_low"] < 3000.0 < row["time_us_high"]  # two launches: t(1), wide
    assert row["busbw"] == round(4096 / 0.003 / 1e9, 4) and row["algbw"] == row["busbw"]  # n = 2: factor 1
    assert row["busbw_low"] < row["busbw"] < row["busbw_high"]
    assert row["wrong"] == 2  # rank 1's one wrong element, in each launch
    footer = tables["sweep_footer"][0]
    assert footer["wrong"] == 2 and footer["sizes"] == 1 and footer["avg_busbw"] == row["busbw"]
    assert tables["sweep_unsupported"][0]["collective"] == "allgather"


def test_noise_floor_is_the_spread_of_the_a_a_pair():
    aa = [single(1, [0.010, 0.010, 0.010], 0.03, tag="aa"), single(2, [0.011, 0.011, 0.011], 0.033, tag="aa")]
    floor = build_tables(aa + CELLS)["noise_floor"]
    assert floor["medians_ms"] == [10.0, 11.0] and floor["spread"] == round(1 / 10.5, 4)
    assert len(build_tables(aa + CELLS)["training"]) == 2  # the A/A launches are not a row of their own


def test_verdict_is_in_the_tables_with_claims():
    verdict = build_tables(CELLS)["verdict"]
    claims = [v["claim"] for v in verdict]
    assert "mlp, 1 process: fastest single · python" in claims
    assert all(v["text"].startswith(v["claim"].split(":")[0]) for v in verdict)


def test_rendered_tables_carry_every_header_and_interval():
    tables = build_tables(CELLS + [FAILED])
    text = render(tables["training"], TRAINING_COLUMNS)
    for header in TRAINING_COLUMNS.values():
        assert header in text
    assert "30 ±" in text and "40.0% [" in text and "—" in text and "1,000" in text
    md = render(tables["training"], TRAINING_COLUMNS, "github")
    assert md.splitlines()[1].startswith("|-") and md.count("\n") == len(tables["training"]) + 1
    assert format_value("prediction_error", 0.0123) == "+1.23%" and format_value("agree", True) == "yes"
    assert "a\\|b" in render([{"status": "a|b"}], {"status": "status"}, "github")
    keys = csv_columns(TRAINING_COLUMNS, tables["training"])
    assert keys[keys.index("step_ms_median") + 1 : keys.index("step_ms_median") + 3] == [
        "step_ms_median_low",
        "step_ms_median_high",
    ]


AVAILABLE = {"single": None, "dp": None, "ddp": None, "ddp-gloo": None, "ddp-nccl": "NCCL needs CUDA", "horovod": None}


def test_matrix_on_a_two_core_host_without_gpu():
    m = build_matrix(BenchConfig(nprocs=[1, 2], repeat=2), available=AVAILABLE, cuda_devices=0, total_cores=2)
    ids = [c.id for c in m.cells]
    train = [
        "single-python-1",
        "ddp-gloo-torchrun-1",
        "ddp-gloo-torchrun-2",
        "horovod-mpirun-1",
        "horovod-mpirun-2",
        "horovod-horovodrun-1",
        "horovod-horovodrun-2",
    ]
    assert ids == [
        "single-python-1-aa-r1",
        "single-python-1-aa-r2",
        *[f"{t}-r1" for t in train],  # round 1 launches every cell, then round 2
        *[f"{t}-r2" for t in train],
    ]
    by_id = {c.id: c for c in m.cells}
    # one thread per process at every count on 2 cores: the baseline computes as each rank of 2 does
    assert {c.threads for c in m.cells} == {1}
    assert by_id["single-python-1-aa-r1"].models == (BenchConfig().models[0],)
    assert [c.sweep for c in m.cells if c.kind == "train" and c.repeat == 1 and not c.tag] == [
        False,
        False,
        True,
        False,
        True,
        False,
        True,
    ]
    assert set(m.skipped) == {"dp", "ddp", "ddp-nccl"} and "NCCL needs CUDA" in m.skipped["ddp-nccl"]


def test_matrix_on_a_gpu_host_adds_dp_and_ddp_nccl_up_to_the_gpu_count():
    available = {**AVAILABLE, "ddp-nccl": None}
    m = build_matrix(
        BenchConfig(nprocs=[1, 2, 4], allreduce=False, repeat=1, aa_check=False),
        available=available,
        cuda_devices=2,
        total_cores=16,
    )
    ids = [c.id for c in m.cells]
    assert "dp-python-1-r1" in ids and "ddp-nccl-torchrun-2-r1" in ids and "ddp-nccl-torchrun-4-r1" not in ids
    assert not any(c.sweep or "-aa-" in c.id for c in m.cells)
    assert {c.threads for c in m.cells} == {4}  # 16 cores over the largest count, at every count


def test_matrix_keeps_the_single_baseline_and_refuses_unknown_names():
    base = dict(available=AVAILABLE, cuda_devices=0, total_cores=2)
    m = build_matrix(BenchConfig(backends=["ddp-gloo"], nprocs=[2], repeat=1, aa_check=False), **base)
    assert [c.id for c in m.cells] == ["single-python-1-r1", "ddp-gloo-torchrun-2-r1"]
    m = build_matrix(
        BenchConfig(backends=["horovod"], launchers=["horovodrun"], nprocs=[2], repeat=1, aa_check=False), **base
    )
    assert [c.id for c in m.cells] == ["single-python-1-r1", "horovod-horovodrun-2-r1"]
    m = build_matrix(BenchConfig(backends=["ddp-nccl"], repeat=1, aa_check=False), **base)
    assert "ddp-nccl" in m.skipped and [c.id for c in m.cells] == ["single-python-1-r1"]
    from paraflow.errors import UnknownBackendError

    with pytest.raises(UnknownBackendError, match="known: single"):
        build_matrix(BenchConfig(backends=["mpi-magic"]), **base)


def test_matrix_gives_every_cell_the_threads_asked_for():
    base = dict(available=AVAILABLE, cuda_devices=0, total_cores=8)
    m = build_matrix(BenchConfig(nprocs=[1, 2], repeat=1), **base)
    assert {c.threads for c in m.cells} == {4}  # 8 cores over 2 processes, at 1 process too
    m = build_matrix(BenchConfig(nprocs=[1, 2], repeat=1, threads=3), **base)
    assert {c.threads for c in m.cells} == {3}


TORCHRUN_STDERR = """[rank0]: Traceback (most recent call last):
[rank0]:   File "worker.py", line 3, in <module>
[rank0]:     raise AssertionError("embed_dim must be divisible by num_heads")
[rank0]: AssertionError: embed_dim must be divisible by num_heads
E0101 torch/distributed/elastic/multiprocessing/api.py] failed (exitcode: 1)
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
"""
MPIRUN_STDERR = """ValueError: bad value
--------------------------------------------------------------------------
mpirun detected that one or more processes exited with non-zero status
  Process name: [[21880,1],0]
  Exit code:    1
--------------------------------------------------------------------------
"""
HOROVODRUN_STDERR = "[1]<stderr>:RuntimeError: Gloo connect failed\nProcess 1 exit with status code 1.\n"


def test_failure_reason_finds_the_root_exception_under_each_launcher():
    assert failure_reason(TORCHRUN_STDERR, 1) == "AssertionError: embed_dim must be divisible by num_heads"
    assert failure_reason(MPIRUN_STDERR, 1) == "ValueError: bad value"
    assert failure_reason(HOROVODRUN_STDERR, 1) == "RuntimeError: Gloo connect failed"
    assert failure_reason("something odd\nlast words\n", 3) == "last words"
    assert failure_reason("", 3) == "exit status 3, no error output"


def test_fsdp_shares_ddps_collectives_so_only_one_of_them_sweeps():
    available = {**AVAILABLE, "fsdp": None}
    both = build_matrix(
        BenchConfig(backends=["ddp-gloo", "fsdp"], nprocs=[2], repeat=1, aa_check=False),
        available=available,
        cuda_devices=0,
        total_cores=2,
    )
    swept = {c.backend for c in both.cells if c.kind == "train" and c.sweep}
    assert swept == {"ddp-gloo"}
    alone = build_matrix(
        BenchConfig(backends=["fsdp"], nprocs=[2], repeat=1, aa_check=False),
        available=available,
        cuda_devices=0,
        total_cores=2,
    )
    assert {c.backend for c in alone.cells if c.kind == "train" and c.sweep} == {"fsdp"}


def test_sweep_rows_keep_the_planned_launches_only():
    extra = {**ddp(3, 5.0), "sweep": False}  # an extra launch of a noisy cell skips the sweep
    for r in extra["ranks"]:
        r["tasks"].pop("sweep")
    row = build_tables(CELLS + [extra])["sweep"][0]
    assert row["status"] == "ok" and row["launches"] == 2 and row["time_us"] == 3000.0


def test_an_older_runs_sweep_is_read_from_its_raw_side():
    older = [ddp(1, 1.0), ddp(2, 2.0)]  # its rows also held paraflow's side and other element types
    for cell in older:
        for r in cell["ranks"]:
            rows = r["tasks"]["sweep"]["rows"]
            rows += [{**rows[0], "impl": "public", "round_s": [9.0, 9.0]}, {**rows[0], "dtype": "float16"}]
    (row,) = build_tables(older)["sweep"]
    assert row["impl"] == "raw" and row["time_us"] == 3000.0


def test_an_older_runs_tuning_and_trace_launches_stay_out_of_the_rows():
    older = [single(1, [0.5, 0.5, 0.5], 1.5, tag="trace")]
    older += [{**single(1, [0.5, 0.5, 0.5], 1.5, tag="tune-bucket_cap_mb=1"), "options": {"bucket_cap_mb": 1}}]
    rows = build_tables(CELLS + older)["training"]
    assert [r["step_ms_median"] for r in rows] == [r["step_ms_median"] for r in build_tables(CELLS)["training"]]


class _Launched:
    """What run_cells returns for one launch, as far as extra_launches reads it."""

    def __init__(self, record: dict) -> None:
        self.record = record

    def to_dict(self) -> dict:
        return self.record


def _planned(repeat):
    cells = []
    for r in range(1, repeat + 1):
        cells += [Cell("train", "single", "python", 1, 1, ("mlp",), repeat=r)]
        cells += [Cell("train", "ddp-gloo", "torchrun", 2, 1, ("mlp",), sweep=True, repeat=r)]
    return cells


def test_only_cells_whose_interval_stays_wide_get_more_launches_within_the_budget():
    steady = [single(r, [0.010, 0.010, 0.010], 0.03) for r in (1, 2, 3)]  # the same every launch
    erratic = [ddp(r, scale) for r, scale in ((1, 1.0), (2, 2.0), (3, 1.4))]  # twice as slow, then between
    done = [_Launched(c) for c in steady + erratic]
    assert wide_groups([c.to_dict() for c in done], 0.10, ("weak",)) == ["ddp-gloo-torchrun-2"]
    # launches 10%-20% apart are wide too, but less so: the widest cell comes first
    mild = [single(r, [t] * 3, 3 * t) for r, t in ((1, 0.010), (2, 0.012), (3, 0.011))]
    assert wide_groups(mild + erratic, 0.10, ("weak",)) == ["ddp-gloo-torchrun-2", "single-python-1"]
    launched = []

    def launch(cell):
        launched.append(cell)
        return [_Launched(ddp(cell.repeat, 1.4))]

    config = BenchConfig(repeat=3, max_repeat=5, time_budget=60.0)
    extra = run_extra_launches(_planned(3), done, config, time.monotonic(), launch)
    # still wide after the fourth launch, so a fifth; never past --max-repeat; never the sweep
    assert [(c.group, c.repeat, c.sweep) for c in launched] == [
        ("ddp-gloo-torchrun-2", 4, False),
        ("ddp-gloo-torchrun-2", 5, False),
    ]
    assert len(extra) == 2
    launched.clear()  # a run that has spent its time budget launches nothing more
    assert run_extra_launches(_planned(3), done, config, time.monotonic() - 60.0, launch) == [] and not launched
    launched.clear()  # nor does --max-repeat equal to --repeat
    assert run_extra_launches(_planned(3), done, BenchConfig(repeat=3), time.monotonic(), launch) == []


def test_max_repeat_below_repeat_is_refused():
    with pytest.raises(ConfigurationError, match="max_repeat=2: must be at least 3"):
        BenchConfig(repeat=3, max_repeat=2)
    with pytest.raises(ConfigurationError, match="time_budget=0: must be at least 1"):
        BenchConfig(time_budget=0)
