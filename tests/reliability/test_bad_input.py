"""Bad input ends with a clear error on every rank, never a hang or a silent wrong result.

Mismatched collectives (shape, number of dimensions, dtype, op, source rank, a different
collective) under the cross-rank check, a world size that the started processes do not fill, a rendezvous port that is
taken, and a model with parameters that get no gradient. Real processes, 2 ranks.
"""

import re
import socket

import pytest
from conftest import requires_horovod
from faultkit import TIMEOUT_S, events, run_worker, start_by_hand

from paraflow.environment.launchers import free_port

BACKENDS = [
    pytest.param("ddp-gloo", "torchrun", id="ddp-gloo-torchrun"),
    pytest.param("horovod", "mpirun", id="horovod-mpirun", marks=requires_horovod),
    pytest.param("horovod", "horovodrun", id="horovod-horovodrun", marks=requires_horovod),
]

# case -> (phrase naming the problem, what rank 0 called, what rank 1 called)
MISMATCHES = {
    "allreduce-shape": ("shape differs", "allreduce(float32[3], op=sum)", "allreduce(float32[4], op=sum)"),
    "allreduce-ndim": ("shape differs", "allreduce(float32[4], op=sum)", "allreduce(float32[2, 2], op=sum)"),
    "allreduce-dtype": ("dtype differs", "allreduce(float32[4], op=sum)", "allreduce(float64[4], op=sum)"),
    "allreduce-op": ("different arguments", "allreduce(float32[4], op=sum)", "allreduce(float32[4], op=max)"),
    "broadcast-shape": ("shape differs", "broadcast(float32[3], src=0)", "broadcast(float32[4], src=0)"),
    "broadcast-ndim": ("shape differs", "broadcast(float32[4], src=0)", "broadcast(float32[2, 2], src=0)"),
    "broadcast-dtype": ("dtype differs", "broadcast(float32[4], src=0)", "broadcast(int32[4], src=0)"),
    "broadcast-src": ("different arguments", "broadcast(float32[4], src=0)", "broadcast(float32[4], src=1)"),
    "allgather-shape": ("shape differs", "allgather(float32[3])", "allgather(float32[4])"),
    "allgather-ndim": ("shape differs", "allgather(float32[4])", "allgather(float32[2, 2])"),
    "allgather-dtype": ("dtype differs", "allgather(float32[4])", "allgather(float64[4])"),
    "allreduce-vs-broadcast": (
        "different collectives",
        "allreduce(float32[4], op=sum)",
        "broadcast(float32[4], src=0)",
    ),
    "allreduce-vs-barrier": ("different collectives", "allreduce(float32[4], op=sum)", "barrier()"),
    "allgather-vs-broadcast": ("different collectives", "allgather(float32[4])", "broadcast(float32[4], src=0)"),
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend, launcher", BACKENDS)
def test_mismatched_collectives_fail_on_every_rank_naming_both_sides(backend, launcher):
    result = run_worker(launcher, 2, "mismatch.py", backend, timeout=180)
    seen = events(result.stdout)
    assert result.returncode == 0, result.stderr[-4000:]
    for case, (problem, call0, call1) in MISMATCHES.items():
        for rank in (0, 1):
            [outcome] = [e for e in seen if e["case"] == case and e["rank"] == rank]
            assert outcome["outcome"] == "error" and outcome["type"] == "CollectiveError", outcome
            message = outcome["message"]
            assert problem in message, (case, message)
            assert f"rank 0 called {call0}" in message and f"rank 1 called {call1}" in message, (case, message)
    finals = [e for e in seen if e["case"] == "final"]
    assert [e["sum"] for e in finals] == [2.0, 2.0], "the job is unusable after the mismatches"


# The mismatches horovod itself reports (one tensor name, other shapes or dtypes): without the check.
HOROVOD_FINDS = [case for case in MISMATCHES if case.endswith(("-shape", "-ndim", "-dtype"))]


@pytest.mark.timeout(240)
@requires_horovod
def test_horovods_own_mismatch_error_names_every_ranks_call():
    result = run_worker("mpirun", 2, "mismatch.py", "horovod", "--unchecked", *HOROVOD_FINDS, timeout=180)
    seen = events(result.stdout)
    assert result.returncode == 0, result.stderr[-4000:]
    for case in HOROVOD_FINDS:
        problem, call0, call1 = MISMATCHES[case]
        for rank in (0, 1):
            [outcome] = [e for e in seen if e["case"] == case and e["rank"] == rank]
            message = outcome["message"] or ""
            assert outcome["type"] == "CollectiveError" and problem in message, (case, outcome)
            assert f"rank 0 called {call0}" in message and f"rank 1 called {call1}" in message, (case, message)
    assert [e["sum"] for e in seen if e["case"] == "final"] == [2.0, 2.0], "a failed call counted as made"


@pytest.mark.timeout(180)
def test_a_mismatch_gloo_lets_through_fails_the_job_at_its_end_naming_both_calls():
    """gloo completes a broadcast into a larger tensor: the end of the job finds it."""
    result = run_worker("torchrun", 2, "mismatch.py", "ddp-gloo", "--unchecked", "broadcast-shape", timeout=150)
    assert [e["outcome"] for e in events(result.stdout) if e["case"] == "broadcast-shape"] == ["ok", "ok"]
    assert result.returncode != 0, result.stderr[-3000:]
    for rank in (0, 1):
        assert re.search(
            rf"CollectiveError: the check at the end of the job on rank {rank} of 2 .*: the tensor's shape differs "
            r"across ranks: rank 0 called broadcast\(float32\[3\], src=0\) as collective #1 at mismatch\.py:\d+; "
            r"rank 1 called broadcast\(float32\[4\], src=0\) as collective #1",
            result.stderr,
        ), result.stderr[-3000:]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend, launcher", BACKENDS[:2])
def test_debug_mode_stops_the_uneven_evaluation_at_once_naming_both_call_sites(backend, launcher):
    result = run_worker(launcher, 2, "uneven_eval.py", backend, timeout=150, env={"PARAFLOW_DEBUG": "1"})
    assert result.returncode != 0
    errors = [e for e in events(result.stdout) if e.get("error")]
    assert sorted(e["rank"] for e in errors) == [0, 1], result.stdout[-3000:] + result.stderr[-3000:]
    for error in errors:
        assert error["error"] == "CollectiveError" and "ranks called different collectives" in error["message"]
        numbers = [
            re.search(rf"rank {rank} called {call} as collective #(\d+) at uneven_eval\.py:\d+", error["message"])
            for rank, call in ((0, r"allreduce\(float32\[2\], op=sum\)"), (1, r"allgather\(float32\[1\]\)"))
        ]
        assert all(numbers) and numbers[0][1] == numbers[1][1], error["message"]


@pytest.mark.timeout(240)
def test_debug_mode_traces_every_collective_and_turns_on_torch_debug():
    result = run_worker(
        "torchrun", 2, "mismatch.py", "ddp-gloo", "allreduce-shape", timeout=180, env={"PARAFLOW_DEBUG": "1"}
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for rank, shape in ((0, 3), (1, 4)):
        assert (
            f"[paraflow debug] rank {rank}: allreduce(float32[{shape}], op=sum) as collective #1 at mismatch.py:"
        ) in result.stderr, result.stderr[-3000:]
    finals = [e for e in events(result.stdout) if e["case"] == "final"]
    assert {e["torch_debug_level"] for e in finals} == {"DebugLevel.INFO"}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["ddp-gloo", pytest.param("horovod", marks=requires_horovod)])
def test_world_size_larger_than_the_started_processes(backend):
    ranks = start_by_hand("startup.py", [0, 1], 3, backend, timeout=120)  # WORLD_SIZE=3, 2 started
    for rank in ranks:
        [report] = events(rank.stdout)
        assert rank.returncode != 0 and report["type"] == "LauncherError", (rank.rank, report, rank.stderr[-2000:])
        assert "says the job has 3 processes" in report["message"] and "--nproc_per_node 3" in report["message"]
        # Measured: DDP 10-11 s, horovod's rendezvous 20 s on rank 0 (it waits twice).
        assert report["seconds"] <= 2 * TIMEOUT_S + 5, report


def _hold_port():
    """A listening socket on a free local port, standing for another program that owns it."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", free_port("127.0.0.1")))
    holder.listen()
    return holder, holder.getsockname()[1]


def _check_port_error(report, port):
    assert report["type"] == "LauncherError", report
    assert f"127.0.0.1:{port}" in report["message"] and "already in use" in report["message"], report
    assert report["seconds"] <= 5, report


@pytest.mark.timeout(240)
def test_taken_master_port_under_mpirun_is_named():
    holder, port = _hold_port()
    with holder:
        result = run_worker(
            "mpirun",
            2,
            "startup.py",
            "ddp-gloo",
            timeout=120,
            env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
        )
    assert result.returncode != 0
    [report] = [e for e in events(result.stdout) if e["outcome"] == "error" and "already in use" in e["message"]]
    _check_port_error(report, port)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["ddp-gloo", pytest.param("horovod", marks=requires_horovod)])
def test_taken_port_started_by_hand_is_named_and_nobody_waits_forever(backend):
    holder, port = _hold_port()
    with holder:
        ranks = start_by_hand("startup.py", [0, 1], 2, backend, port=port, timeout=120)
    _check_port_error(events(ranks[0].stdout)[0], port)
    # Rank 1 reached the port, which another program holds: it gives up after the timeout.
    [report] = events(ranks[1].stdout)
    assert ranks[1].returncode != 0 and report["type"] == "LauncherError", (report, ranks[1].stderr[-2000:])
    assert report["seconds"] <= TIMEOUT_S + 15, report


@pytest.mark.timeout(240)
def test_unused_parameters_under_ddp_say_how_to_fix_it():
    result = run_worker("torchrun", 2, "unused.py", "ddp-gloo", timeout=180)
    reports = events(result.stdout)
    assert len(reports) == 2
    for report in reports:
        assert report["outcome"] == "error" and report["type"] == "ConfigurationError", report
        message = report["message"]
        assert "spare.weight" in message and "spare.bias" in message
        assert "paraflow.init('ddp-gloo', find_unused_parameters=True)" in message and "Horovod" in message


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "backend, launcher, options",
    [
        pytest.param("ddp-gloo", "torchrun", ["find_unused_parameters=1"], id="ddp-gloo-find-unused"),
        pytest.param("horovod", "mpirun", [], id="horovod", marks=requires_horovod),
    ],
)
def test_unused_parameters_train_when_handled(backend, launcher, options):
    result = run_worker(launcher, 2, "unused.py", backend, *options, timeout=180)
    reports = events(result.stdout)
    assert [r["outcome"] for r in reports] == ["ok", "ok"], reports
    assert reports[0]["checksum"] == pytest.approx(reports[1]["checksum"]), "ranks' parameters differ"
