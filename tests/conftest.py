"""Shared test helpers: launching workers under real launchers with hard timeouts."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from paraflow.backends.horovod.info import horovod_missing_reason
from paraflow.environment.launchers import launcher_variables
from paraflow.tools.launch import launch_command, run_launch

ROOT = Path(__file__).resolve().parent.parent
WORKERS = Path(__file__).resolve().parent / "workers"

#: Test files that start whole jobs end to end, several launches a test (the benchmark's runs, the
#: fault and restart matrices, cross-backend resumes): marked `long`, out of `make test`, run by
#: `make test-long` and by CI.
LONG_SETS = {
    "tests/bench/test_bench_e2e.py",
    "tests/bench/test_bench_faults.py",
    "tests/bench/test_bench_scratch.py",
    "tests/bench/test_bench_screen.py",
    "tests/bench/test_bench_script.py",
    "tests/backends/fsdp/test_fsdp_checkpoint.py",
    "tests/backends/fsdp/test_fsdp_train_script.py",
    "tests/docs/test_porting_guide.py",
    "tests/elastic/test_elastic_launch.py",
    "tests/elastic/test_elastic_membership.py",
    "tests/environment/test_mpich_launcher.py",
    "tests/reliability/test_first_failure.py",
    "tests/reliability/test_rank_failures.py",
    "tests/reliability/test_restart_and_load.py",
    "tests/reliability/test_stopped_rank_ends_job.py",
    "tests/reliability/test_stopped_rank_phases.py",
    "tests/training/test_resume_world_size.py",
    "tests/test_install_as_user.py",
}
#: Further cases of a behaviour `make test` already checks under another backend or launcher:
#: marked `long` as well.
LONG_CASES = {
    "tests/backends/ddp/test_comm_hooks.py::test_exit_after_a_hook_whose_thread_still_holds_its_continuation[torch]",
    "tests/backends/horovod/test_horovod.py::test_real_ranks[horovodrun-sum]",
    "tests/backends/horovod/test_horovod.py::test_real_ranks[torchrun-fp16-predivide]",
    "tests/core/test_clean_exit.py::test_the_end_of_a_job_that_did_its_work_exits_0_every_time[ddp-gloo-torchrun-20]",
    "tests/core/test_clean_exit.py::test_the_end_of_a_job_that_did_its_work_exits_0_every_time[fsdp-torchrun-5]",
    "tests/core/test_clean_exit.py::test_the_end_of_a_job_that_did_its_work_exits_0_every_time[horovod-mpirun-5]",
    "tests/core/test_clean_exit.py::test_the_readme_quick_start_under_paraflow_run_exits_0_every_time",
    "tests/core/test_clean_exit.py::test_dropping_the_model_after_shutdown_never_hangs",
    "tests/core/test_collectives.py::test_collectives_match_hand_computed_results[ddp-gloo-mpirun]",
    "tests/core/test_collectives.py::test_collectives_match_hand_computed_results[horovod-horovodrun]",
    "tests/core/test_collectives.py::test_collectives_match_hand_computed_results[horovod-torchrun]",
    "tests/core/test_portable.py::test_the_same_script_runs_unchanged_and_ignores_the_other_backends_options"
    "[fsdp-torchrun]",
    "tests/core/test_portable.py::test_the_same_script_runs_unchanged_and_ignores_the_other_backends_options"
    "[horovod-horovodrun]",
    "tests/core/test_portable.py::test_the_same_script_runs_unchanged_and_ignores_the_other_backends_options"
    "[single-python]",
    "tests/core/test_two_sessions.py::test_a_second_init_in_the_same_process_starts_a_fresh_group[fsdp-torchrun]",
    "tests/reliability/test_bad_input.py::test_mismatched_collectives_fail_on_every_rank_naming_both_sides"
    "[horovod-horovodrun]",
    "tests/reliability/test_bad_input.py::test_taken_port_started_by_hand_is_named_and_nobody_waits_forever[horovod]",
    "tests/reliability/test_bad_input.py::test_unused_parameters_train_when_handled[horovod]",
    "tests/reliability/test_bad_input.py::test_world_size_larger_than_the_started_processes[horovod]",
    "tests/reliability/test_error_messages.py::test_a_timeout_inside_a_call_names_that_call_the_rank_and_the_silent_rank"
    "[wrap_model]",
    "tests/reliability/test_stall.py::test_save_under_if_rank_0_gives_a_stall_report_naming_both_calls_and_the_fix"
    "[horovod-mpirun]",
    "tests/reliability/test_stall.py::test_stall_watch_adds_no_operation_per_step[horovod-mpirun]",
    "tests/reliability/test_stall.py::test_uneven_evaluation_ends_with_a_stall_report_naming_each_ranks_collective"
    "[horovod-mpirun]",
    "tests/reliability/test_stall.py::test_uneven_shards_fail_before_the_first_step_naming_join_and_drop_last"
    "[horovod-mpirun]",
    "tests/test_train_script.py::test_train_reaches_accuracy_bar_on_digits[ddp-gloo-mpirun2]",
    "tests/test_train_script.py::test_train_reaches_accuracy_bar_on_digits[ddp-gloo-python1]",
    "tests/test_train_script.py::test_train_reaches_accuracy_bar_on_digits[horovod-horovodrun2]",
    "tests/test_train_script.py::test_train_reaches_accuracy_bar_on_digits[horovod-mpirun2]",
    "tests/test_train_script.py::test_train_reaches_accuracy_bar_on_digits[horovod-torchrun2]",
    "tests/test_train_script.py::test_train_reaches_accuracy_bar_on_digits[single-python1]",
    "tests/tools/test_run.py::test_train_py_runs_on_two_ranks[horovod-horovodrun-horovodrun]",
    "tests/training/test_compression.py::test_compressed_training_stays_within_the_wire_dtype_precision"
    "[ddp-gloo-torchrun-bf16]",
    "tests/training/test_equivalence.py::test_accumulate_matches_one_step_on_the_whole_batch[horovod-mpirun]",
    "tests/training/test_equivalence.py::test_horovod_gradient_accumulation_matches_single[no_sync-horovodrun]",
    "tests/training/test_porting_gradients.py::test_clip_grad_norm_between_backward_and_step_matches_one_process_bit_for_bit"
    "[horovod-gloo]",
    "tests/training/test_porting_gradients.py::test_clip_grad_value_matches_one_process_bit_for_bit[ddp-gloo]",
    "tests/training/test_porting_gradients.py::test_clip_grad_value_matches_one_process_bit_for_bit[fsdp]",
    "tests/training/test_porting_gradients.py::test_no_sync_around_the_forward_only_accumulates_as_on_ddp"
    "[horovod-gloo]",
    "tests/training/test_porting_gradients.py::test_torchs_own_clip_grad_norm_after_backward_matches_one_process"
    "[horovod-gloo]",
    "tests/training/test_resume.py::test_checkpoint_resumes_under_the_other_backend[ddp-gloo-horovod]",
    "tests/training/test_resume.py::test_resumed_run_is_bitwise_equal_to_the_straight_run[horovod]",
    "tests/training/test_train_flags.py::test_uneven_shards_join_and_checkpoint_after_the_join[horovod]",
    "tests/training/test_uneven.py::test_skewed_ranks_finish_with_the_same_model_and_optimizer[horovod-mpirun]",
    "tests/bench/test_bench_compile.py::test_each_backend_has_an_eager_and_a_compiled_row_with_intervals",
    "tests/bench/test_bench_compile.py::test_the_compiled_launches_ran_compiled_models",
    "tests/training/test_compiled.py::test_torchs_own_compiler_trains_singles_parameters_on_ddp",
    "tests/training/test_compiled.py::test_train_py_compile_runs_as_the_docs_print_it",
    "tests/training/test_compiled.py::test_a_compiled_model_trains_singles_parameters_and_its_graph_runs"
    "[fsdp-wrap_compiled]",
    "tests/training/test_compiled.py::test_a_compiled_model_trains_singles_parameters_and_its_graph_runs"
    "[fsdp-compile_wrapped]",
    "tests/training/test_compiled.py::test_a_compiled_model_trains_singles_parameters_and_its_graph_runs"
    "[horovod-wrap_compiled]",
    "tests/training/test_compiled.py::test_a_compiled_model_trains_singles_parameters_and_its_graph_runs"
    "[horovod-compile_wrapped]",
    "tests/reliability/test_bad_input.py::test_taken_port_started_by_hand_is_named_and_nobody_waits_forever[ddp-gloo]",
    "tests/reliability/test_bad_input.py::test_world_size_larger_than_the_started_processes[ddp-gloo]",
    "tests/reliability/test_stall.py::test_save_under_if_rank_0_gives_a_stall_report_naming_both_calls_and_the_fix"
    "[ddp-gloo-torchrun]",
    "tests/tools/test_comm_check.py::test_single_ddp_gloo_and_horovod_pass_here",
}


def pytest_collection_modifyitems(config, items):
    """Mark the tests of LONG_SETS and LONG_CASES `long`; collecting the whole suite, a LONG_CASES entry
    that names no test is an error."""
    found = set()
    for item in items:
        path = Path(item.fspath).resolve().relative_to(ROOT).as_posix()
        node = f"{path}::{item.name}"
        if path in LONG_SETS or node in LONG_CASES:
            item.add_marker(pytest.mark.long)
            found.add(node)
    whole_suite = list(config.args) == list(config.getini("testpaths")) and not config.getoption("keyword")
    stale = LONG_CASES - found
    if whole_suite and stale:
        raise pytest.UsageError(f"tests/conftest.py LONG_CASES names tests that do not exist: {sorted(stale)}")


# One thread per rank, so ranks on a 2-core machine do not fight for cores.
RANK_ENV = {
    "OMP_NUM_THREADS": "1",
    "PARAFLOW_NUM_THREADS": "1",
    "PYTHONPATH": str(ROOT),
    "PYTHONUNBUFFERED": "1",
    "PYTHONWARNINGS": "ignore",
}

requires_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none is visible")
_HOROVOD_MISSING = horovod_missing_reason()
requires_horovod = pytest.mark.skipif(_HOROVOD_MISSING is not None, reason=f"needs horovod: {_HOROVOD_MISSING}")


def launch(launcher: str, nproc: int, script: list, timeout: float = 120, env: dict | None = None):
    """Run `script` under `launcher` with `nproc` processes; fail the test on timeout.

    A torchrun launch gets a TMPDIR of its own, removed after it: its agent's ``torchelastic_*``
    log directory would otherwise stay in /tmp after every launch."""
    from paraflow.bench.driver.scratch import launch_scratch

    extra = {**RANK_ENV, **(env or {})}
    cmd = launch_command(launcher, nproc, [str(s) for s in script], env_keys=list(extra))
    scratch = launch_scratch(prefix="pf-tests-torchrun-") if launcher == "torchrun" else contextlib.nullcontext({})
    with scratch as directories:
        tmp = {key: value for key, value in directories.items() if key == "TMPDIR" and key not in extra}
        result = run_launch(cmd, timeout=timeout, env={**extra, **tmp}, cwd=str(ROOT))
    assert not result.timed_out, f"timed out after {timeout}s: {' '.join(cmd)}\n{result.stderr[-3000:]}"
    return result


def launch_ok(launcher: str, nproc: int, script: list, timeout: float = 120, env: dict | None = None):
    """Like `launch`, and the launch must exit 0."""
    result = launch(launcher, nproc, script, timeout, env)
    assert result.returncode == 0, (
        f"exit {result.returncode}: {' '.join(result.command)}\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    )
    return result


def read_rank_json(directory: Path, nproc: int) -> list:
    """Per-rank JSON files rank0.json ... written by a worker."""
    return [json.loads((directory / f"rank{r}.json").read_text()) for r in range(nproc)]


@pytest.fixture
def python() -> str:
    return sys.executable


@pytest.fixture(autouse=True)
def _clean_launcher_env(monkeypatch):
    """Unit tests see no launcher variables from the shell that started pytest."""
    for key in launcher_variables(os.environ) + ["PARAFLOW_BACKEND"]:
        monkeypatch.delenv(key, raising=False)


@pytest.fixture(scope="session", autouse=True)
def _no_process_left_behind():
    """After the whole suite, no process it started (launcher, rank, MPI daemon) may still run."""
    from reliability.leftovers import kill_processes, leftover_processes, mark_session

    marker = mark_session()
    yield
    left = leftover_processes(marker)
    if left:
        kill_processes(left)
        pytest.fail(
            "the test suite left processes running (now killed): "
            + "; ".join(f"pid {pid}: {cmd[:200]}" for pid, cmd in left.items()),
            pytrace=False,
        )


@pytest.fixture(scope="session", autouse=True)
def _open_mpi_files_in_scratch():
    """Open MPI's session directories and shared-memory segments go to scratch directories removed
    after the suite: ranks the tests kill would leave them in /tmp and /dev/shm for good."""
    from paraflow.bench.driver.scratch import launch_scratch

    with launch_scratch(prefix="pf-tests-", tmp_variable="OMPI_MCA_orte_tmpdir_base") as scratch:
        chosen = {key: value for key, value in scratch.items() if key not in os.environ}
        os.environ.update(chosen)
        yield
        for key in chosen:
            os.environ.pop(key, None)


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_in_scratch():
    """Every process the tests start gets a TMPDIR removed after the suite: a torchrun agent leaves
    a ``torchelastic_*`` directory in it per launch, and many tests start launchers themselves
    (`paraflow run`, `paraflow.launch`, the emulated cluster). This process keeps its own."""
    scratch = tempfile.mkdtemp(prefix="pf-tests-tmp-")  # after this, tempfile's own choice is fixed
    previous = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = scratch
    yield
    if previous is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = previous
    shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture
def no_leftovers(monkeypatch):
    """One rank thread each and a marker for every process the test starts; none may outlive it.

    Yields the environment (a copy) for subprocesses the test starts itself.
    """
    import uuid

    from reliability.leftovers import MARKER_ENV, leftover_processes

    marker = uuid.uuid4().hex
    monkeypatch.setenv(MARKER_ENV, marker)
    for key, value in RANK_ENV.items():
        monkeypatch.setenv(key, value)
    yield dict(os.environ)
    left = leftover_processes(marker, grace_s=3.0)
    assert left == {}, f"processes left behind: {left}"


@pytest.fixture(scope="session")
def float64_reference(tmp_path_factory):
    """Parameters tests/workers/equivalence.py ends with under `single`: each whole batch in one step."""
    out = tmp_path_factory.mktemp("float64-reference") / "single.pt"
    launch_ok("python", 1, [WORKERS / "equivalence.py", "single", out], timeout=180)
    return torch.load(out)
