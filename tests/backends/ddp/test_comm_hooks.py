"""The tracked continuations of paraflow's DDP communication hooks."""

import os
import threading

import pytest
import torch

from paraflow.backends.ddp.comm_hooks import compress_hook, pending_continuations, release_continuations, tracked_then

pytestmark = pytest.mark.timeout(90)  # above the subprocess timeout of 60 s


def test_release_waits_for_the_thread_that_ran_the_continuation():
    """A continuation that ran but is still held by its thread counts as pending until let go."""
    parent = torch.futures.Future()
    child = tracked_then(parent, lambda fut: fut.value() + 1)
    gate = threading.Event()
    child.then(lambda _: gate.wait(10))  # runs in the completing thread, after child completes
    thread = threading.Thread(target=parent.set_result, args=(torch.tensor(1),))
    thread.start()
    assert child.wait() == 2
    try:
        assert pending_continuations() == 1
        assert release_continuations(timeout=0.2) is False
    finally:
        gate.set()
    assert release_continuations(timeout=10) is True
    assert pending_continuations() == 0
    thread.join(10)


def test_a_continuation_that_never_ran_is_not_waited_for():
    never = torch.futures.Future()
    tracked_then(never, lambda fut: fut.value())
    assert pending_continuations() == 0
    assert release_continuations(timeout=0.1) is True


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_compress_hook_names_avoid_ddps_nccl_only_check(dtype):
    """DDP refuses a hook named bf16_compress_hook without NCCL; ours must not carry that name."""
    name = compress_hook(dtype).__name__
    assert name.endswith("_compress") and name != "bf16_compress_hook"


def _hook_exit(kind: str, python: str):
    import resource
    import subprocess

    from conftest import RANK_ENV, ROOT, WORKERS

    from paraflow.environment.launchers import free_port

    return subprocess.run(
        [python, str(WORKERS / "hook_exit.py"), kind, str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, **RANK_ENV},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 0)),
    )


@pytest.mark.timeout(420)  # up to six runs of at most 60 s each
@pytest.mark.parametrize("kind", ["torch", "paraflow"])
def test_exit_after_a_hook_whose_thread_still_holds_its_continuation(kind, python):
    """An abort at exit: gloo's thread wants the GIL during shutdown.

    With torch's own hook the process aborts after a successful backward ("terminate called
    without an active exception", or Python's "Fatal Python error" when the thread reaches the
    interpreter while it finalizes: the same race); with paraflow's it waits for the release and
    exits 0. The abort is a race that the worker makes likely, not certain (about two runs in
    three abort on a loaded machine): torch's hook must abort in at least one of six runs, and
    paraflow's must exit 0 in each of three.
    """
    results = []
    for _ in range(6 if kind == "torch" else 3):
        result = _hook_exit(kind, python)
        assert "backward done" in result.stdout, result.stderr[-3000:]
        results.append(result)
        if kind == "torch" and result.returncode != 0:
            break
    if kind == "torch":
        aborted = [r for r in results if r.returncode != 0]
        crashed = ("terminate called", "Fatal Python error")
        assert aborted and any(sign in aborted[0].stderr for sign in crashed), (
            f"torch's hook no longer aborts at exit (exits {[r.returncode for r in results]}); "
            "paraflow.backends.ddp.comm_hooks' release wait may be unnecessary now"
        )
    else:
        assert all(r.returncode == 0 for r in results), [r.stderr[-3000:] for r in results]
