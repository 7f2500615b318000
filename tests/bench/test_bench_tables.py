"""Table builder, matrix and failure summaries against hand-made per-rank numbers."""

import pytest

from paraflow.bench.driver.config import BenchConfig
from paraflow.bench.driver.matrix import build_matrix
from paraflow.bench.driver.runner import failure_reason
from paraflow.bench.report.tables import (
    ALLREDUCE_COLUMNS,
    OVERHEAD_COLUMNS,
    TRAINING_COLUMNS,
    build_tables,
    format_value,
    render,
)


def train_task(step_s, window_s, losses, peak, batch=32, n=1, **extra):
    return {
        "model": "mlp",
        "model_spec": "mlp",
        "parameters": 1000,
        "grad_bytes": 4000,
        "batch_per_rank": batch,
        "samples_per_step": batch,
        "replicas": n,
        "warmup": 1,
        "steps": len(step_s),
        "step_s": step_s,
        "window_s": window_s,
        "losses": losses,
        "peak_memory_bytes": peak,
        "memory_kind": "rss",
        **extra,
    }


def cell(kind, backend, launcher, nproc, ranks, status="ok", error=None, allreduce=False, models=("mlp",)):
    return {
        "id": f"{backend}-{launcher}-{nproc}",
        "kind": kind,
        "backend": backend,
        "launcher": launcher,
        "nproc": nproc,
        "threads": 1,
        "models": list(models),
        "allreduce": allreduce,
        "command": "cmd",
        "status": status,
        "error": error,
        "elapsed_s": 1.0,
        "ranks": ranks,
    }


def rank(r, n, tasks, transport="gloo"):
    return {"rank": r, "world_size": n, "transport": transport, "device": "cpu", "torch_threads": 1, "tasks": tasks}


SINGLE = cell(
    "train",
    "single",
    "python",
    1,
    [rank(0, 1, {"train/mlp": train_task([0.010, 0.020, 0.030], 0.06, [3.0, 2.0, 1.0], 300e6)}, "none")],
)
DDP = cell(
    "train",
    "ddp-gloo",
    "torchrun",
    2,
    [
        rank(
            0,
            2,
            {
                "train/mlp": train_task(
                    [0.02, 0.04, 0.03],
                    0.12,
                    [9.0, 1.0, 7.0],
                    300e6,
                    n=2,
                    loss_step=2,
                    sync_pair_step_s=[0.04, 0.06],
                    no_sync_step_s=[0.01, 0.02],
                ),
                "allreduce": {
                    "world_size": 2,
                    "device": "cpu",
                    "sizes": [
                        {"bytes": 4096, "count": 1024, "dtype": "float32", "iters": 50, "time_s": 0.001, "wrong": 0},
                        {"bytes": 16384, "count": 4096, "dtype": "float32", "iters": 50, "time_s": 0.004, "wrong": 1},
                    ],
                },
            },
        ),
        rank(
            1,
            2,
            {
                "train/mlp": train_task(
                    [0.03, 0.02, 0.05],
                    0.15,
                    [9.0, 2.0, 7.0],
                    310e6,
                    n=2,
                    loss_step=2,
                    sync_pair_step_s=[0.05, 0.05],
                    no_sync_step_s=[0.02, 0.01],
                ),
                "allreduce": {
                    "world_size": 2,
                    "device": "cpu",
                    "sizes": [
                        {"bytes": 4096, "count": 1024, "dtype": "float32", "iters": 50, "time_s": 0.002, "wrong": 0},
                        {"bytes": 16384, "count": 4096, "dtype": "float32", "iters": 50, "time_s": 0.002, "wrong": 2},
                    ],
                },
            },
        ),
    ],
    allreduce=True,
)
MEMCPY = {
    **cell(
        "memcpy",
        None,
        "python",
        1,
        [
            rank(
                0,
                1,
                {
                    "memcpy": {
                        "threads": 1,
                        "devices": {
                            "cpu": [
                                {"bytes": 4096, "iters": 10, "time_s": 1e-6},
                                {"bytes": 16384, "iters": 10, "time_s": 8e-6},
                            ]
                        },
                    }
                },
            )
        ],
    ),
    "id": "memcpy",
}
OVERHEAD = cell(
    "overhead",
    "ddp-gloo",
    "torchrun",
    1,
    [
        rank(
            0,
            1,
            {
                "overhead": {
                    "rank": 0,
                    "world_size": 1,
                    "device": "cpu",
                    "library": "torch DistributedDataParallel",
                    "model": "mlp",
                    "pairs": 3,
                    "warmup": 1,
                    "paraflow_step_s": [0.0101, 0.0102, 0.0103],
                    "raw_step_s": [0.010, 0.009, 0.011],
                }
            },
        )
    ],
)
FAILED = cell(
    "train", "horovod", "mpirun", 2, [rank(0, 2, {})], status="timed out", error="timed out after 9 s", allreduce=True
)


def test_training_rows_match_hand_computation():
    rows = build_tables([MEMCPY, SINGLE, DDP, FAILED, OVERHEAD])["training"]
    assert [r["backend"] for r in rows] == ["single", "ddp-gloo", "horovod"]
    single, ddp, failed = rows
    assert set(single) == set(TRAINING_COLUMNS)
    # single: 3 steps x 32 samples in 0.06 s
    assert single["samples_per_s"] == 1600.0 and single["weak_scaling_efficiency"] == 1.0
    assert (single["step_ms_median"], single["step_ms_p10"], single["step_ms_p90"]) == (20.0, 12.0, 28.0)
    assert single["comm_overhead"] is None and single["final_loss"] == 1.0 and single["global_batch"] == 32
    # ddp: slowest rank per step [0.03, 0.04, 0.05]; window = slowest rank's 0.15 s; 3 x 64 samples
    assert (ddp["step_ms_median"], ddp["step_ms_p10"], ddp["step_ms_p90"]) == (40.0, 32.0, 48.0)
    assert ddp["global_batch"] == 64 and ddp["samples_per_s"] == 1280.0 and ddp["samples_per_s_per_process"] == 640.0
    assert ddp["weak_scaling_efficiency"] == 0.4  # 1280 / (2 x 1600)
    assert ddp["comm_overhead"] == round(1 - 0.02 / 0.055, 4)  # medians of [0.05, 0.06] and [0.02, 0.02]
    assert ddp["peak_mem_mb"] == 310.0 and ddp["final_loss"] == 1.5  # step 2's losses 1 and 2, not the last
    assert ddp["parameters"] == 1000 and ddp["grad_mb_per_step"] == 0.004 and ddp["transport"] == "gloo"
    # the failed cell still has its row, with its error and no numbers
    assert failed["status"] == "timed out: timed out after 9 s" and failed["samples_per_s"] is None
    assert failed["processes"] == 2 and failed["launcher"] == "mpirun"


def test_allreduce_rows_footer_and_memcpy_match_hand_computation():
    tables = build_tables([MEMCPY, SINGLE, DDP, FAILED])
    small, large, failed = tables["allreduce"]
    assert set(small) == set(ALLREDUCE_COLUMNS)
    # time = slowest rank's mean per operation; n = 2 so busbw = algbw
    assert small["time_us"] == 2000.0 and small["algbw_gbps"] == round(4096 / 0.002 / 1e9, 4)
    assert small["busbw_gbps"] == small["algbw_gbps"] and small["wrong"] == 0
    assert small["memcpy_gbps"] == 4.096 and small["busbw_vs_memcpy"] == round(4096 / 0.002 / 1e9 / 4.096, 4)
    assert large["time_us"] == 4000.0 and large["wrong"] == 3 and large["memcpy_gbps"] == 2.048
    footer = tables["allreduce_footer"][0]
    assert footer["sizes"] == 2 and footer["wrong"] == 3
    assert footer["avg_busbw_gbps"] == round((4096 / 0.002 + 16384 / 0.004) / 2 / 1e9, 4)
    assert failed["backend"] == "horovod" and failed["status"].startswith("timed out")
    assert tables["memcpy"][0] == {"device": "cpu", "threads": 1, "size_bytes": 4096, "time_us": 1.0, "gbps": 4.096}


def test_overhead_row_is_ratio_of_medians():
    (row,) = build_tables([OVERHEAD])["overhead"]
    assert set(row) == set(OVERHEAD_COLUMNS)
    assert row["paraflow_step_ms_median"] == 10.2 and row["raw_step_ms_median"] == 10.0
    assert row["abstraction_overhead"] == 0.02
    assert row["paired_overhead"] == round(0.0101 / 0.010 - 1, 4)  # pair ratios 1.01, 1.1333, 0.9364
    # 3 pairs are too few for order statistics inside the range: the interval is (min, max)
    assert (row["paired_ci_low"], row["paired_ci_high"]) == (round(0.0103 / 0.011 - 1, 4), round(0.0102 / 0.009 - 1, 4))
    assert row["within_target"] == "unresolved"  # the interval straddles 1%
    busy = {"cores": 2, "load_average_1min": {"start": 5.0, "end": 1.0}}
    quiet = {"cores": 2, "load_average_1min": {"start": 1.0, "end": 1.5}}
    fast = {
        **OVERHEAD,
        "ranks": [
            rank(
                0,
                1,
                {
                    "overhead": {
                        **OVERHEAD["ranks"][0]["tasks"]["overhead"],
                        "paraflow_step_s": [0.0100, 0.0090, 0.0110],
                    }
                },
            )
        ],
    }
    assert build_tables([fast], quiet)["overhead"][0]["within_target"] == "yes"  # ratios 1.0, 1.0, 1.0
    assert build_tables([fast], busy)["overhead"][0]["within_target"] == "unresolved: busy machine"


def test_rendered_tables_carry_every_header_and_format_values():
    tables = build_tables([MEMCPY, SINGLE, DDP, FAILED, OVERHEAD])
    text = render(tables["training"], TRAINING_COLUMNS)
    for header in TRAINING_COLUMNS.values():
        assert header in text
    assert "40.0%" in text and "63.6%" in text and "—" in text and "1,000" in text
    md = render(tables["training"], TRAINING_COLUMNS, "github")
    assert md.splitlines()[1].startswith("|-") and md.count("\n") == len(tables["training"]) + 1
    assert format_value("abstraction_overhead", 0.0123) == "+1.23%" and format_value("within_target", True) == "yes"
    assert format_value("paired_ci_low", -0.05) == "-5.00%"
    assert "a\\|b" in render([{"status": "a|b"}], {"status": "status"}, "github")


AVAILABLE = {"single": None, "dp": None, "ddp": None, "ddp-gloo": None, "ddp-nccl": "NCCL needs CUDA", "horovod": None}


def test_matrix_on_a_two_core_host_without_gpu():
    m = build_matrix(BenchConfig(nprocs=[1, 2]), available=AVAILABLE, cuda_devices=0, total_cores=2)
    ids = [c.id for c in m.cells]
    assert ids == [
        "memcpy",
        "single-python-1",
        "ddp-gloo-torchrun-1",
        "ddp-gloo-torchrun-2",
        "horovod-mpirun-1",
        "horovod-mpirun-2",
        "horovod-horovodrun-1",
        "horovod-horovodrun-2",
        "overhead-ddp-gloo-torchrun-2",
        "overhead-horovod-mpirun-2",
    ]
    by_id = {c.id: c for c in m.cells}
    assert by_id["single-python-1"].threads == 2 and by_id["ddp-gloo-torchrun-2"].threads == 1
    assert by_id["memcpy"].threads == 1  # what each rank of the allreduce cells uses
    assert [c.allreduce for c in m.cells if c.kind == "train"] == [False, False, True, False, True, False, True]
    assert set(m.skipped) == {"dp", "ddp", "ddp-nccl"} and "NCCL needs CUDA" in m.skipped["ddp-nccl"]


def test_matrix_on_a_gpu_host_adds_dp_and_ddp_nccl_up_to_the_gpu_count():
    available = {**AVAILABLE, "ddp-nccl": None}
    m = build_matrix(
        BenchConfig(nprocs=[1, 2, 4], allreduce=False, overhead=False),
        available=available,
        cuda_devices=2,
        total_cores=16,
    )
    ids = [c.id for c in m.cells]
    assert "dp-python-1" in ids and "ddp-nccl-torchrun-2" in ids and "ddp-nccl-torchrun-4" not in ids
    assert "memcpy" not in ids and not any(i.startswith("overhead") for i in ids)
    assert {c.threads for c in m.cells if c.nproc == 4} == {4}


def test_matrix_keeps_the_single_baseline_and_refuses_unknown_names():
    m = build_matrix(
        BenchConfig(backends=["ddp-gloo"], nprocs=[2], overhead=False),
        available=AVAILABLE,
        cuda_devices=0,
        total_cores=2,
    )
    assert [c.id for c in m.cells] == ["memcpy", "single-python-1", "ddp-gloo-torchrun-2"]
    m = build_matrix(
        BenchConfig(backends=["horovod"], launchers=["horovodrun"], nprocs=[2]),
        available=AVAILABLE,
        cuda_devices=0,
        total_cores=2,
    )
    assert [c.id for c in m.cells] == ["memcpy", "single-python-1", "horovod-horovodrun-2"]
    m = build_matrix(BenchConfig(backends=["ddp-nccl"]), available=AVAILABLE, cuda_devices=0, total_cores=2)
    assert "ddp-nccl" in m.skipped and [c.id for c in m.cells] == ["single-python-1"]
    from paraflow.errors import UnknownBackendError

    with pytest.raises(UnknownBackendError, match="known: single"):
        build_matrix(BenchConfig(backends=["mpi-magic"]), available=AVAILABLE, cuda_devices=0, total_cores=2)


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
