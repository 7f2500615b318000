"""The step breakdown, from hand-made marks and rows (no processes)."""

import pytest
import torch

from paraflow.bench.rank.train_loop import gradient_clock, pair_breakdown, step_parts, timed_synchronize
from paraflow.bench.report.tables import SUMMED, breakdown_estimates, launch_parts


def marks(zeroed, first, last, backward, optimizer, sync=None):
    m = {"zeroed": zeroed, "backward": backward, "optimizer": optimizer}
    if first is not None:
        m.update(first_grad=first, last_grad=last)
    if sync:
        m.update(sync_start=sync[0], sync_end=sync[1])
    return m


def test_a_ddp_pair_splits_into_parts_that_add_up_to_the_synced_step():
    # synced: 1 ms to device and zero_grad, forward+backward to 6 ms (gradients ready 3..5 ms, then
    # 1 ms waiting for the last bucket), optimizer 6..7 ms, device sync to 7.5 ms
    synced = step_parts(marks(1e-3, 3e-3, 5e-3, 6e-3, 7e-3), 0.0, 7.5e-3)
    unsynced = step_parts(marks(1e-3, 3e-3, 4.9e-3, 5e-3, 6e-3), 0.0, 6.2e-3)
    parts = pair_breakdown(synced, unsynced)
    assert parts["compute_s"] == pytest.approx(4e-3) and parts["optimizer_s"] == pytest.approx(1e-3)
    assert parts["exposed_comm_s"] == pytest.approx(1e-3 - 0.1e-3)  # the synced tail beyond the unsynced one
    assert parts["overlapped_comm_s"] == pytest.approx(2e-3)  # first to last gradient
    assert parts["step_s"] == pytest.approx(7.5e-3)


def test_horovod_exposed_communication_is_the_wait_in_synchronize():
    synced = step_parts(marks(1e-3, 2e-3, 4e-3, 4e-3, 8e-3, sync=(4e-3, 7e-3)), 0.0, 8e-3)
    unsynced = step_parts(marks(1e-3, 2e-3, 4e-3, 4e-3, 5e-3), 0.0, 5e-3)
    parts = pair_breakdown(synced, unsynced)
    assert parts["exposed_comm_s"] == pytest.approx(3e-3) and parts["optimizer_s"] == pytest.approx(1e-3)


def test_without_gradient_hooks_the_whole_backward_difference_is_exposed_and_overlap_unknown():
    synced = step_parts(marks(1e-3, None, None, 9e-3, 10e-3), 0.0, 10e-3)
    unsynced = step_parts(marks(1e-3, None, None, 6e-3, 7e-3), 0.0, 7e-3)
    parts = pair_breakdown(synced, unsynced)
    assert parts["exposed_comm_s"] == pytest.approx(3e-3) and parts["overlapped_comm_s"] is None


def test_a_backend_that_communicates_without_sync_counts_the_whole_difference():
    """fsdp: gradients land after the reduce-scatter, so tails are not comparable (they would give
    negative communication); the whole forward + backward difference is exposed, overlap unknown."""
    synced = step_parts(marks(1e-3, 3e-3, 8.9e-3, 9e-3, 10e-3), 0.0, 10e-3)  # last gradient after the sync
    unsynced = step_parts(marks(1e-3, 3e-3, 4e-3, 7e-3, 8e-3), 0.0, 8e-3)
    assert pair_breakdown(synced, unsynced)["exposed_comm_s"] < 0  # what tails would say
    parts = pair_breakdown(synced, unsynced, whole=True)
    assert parts["exposed_comm_s"] == pytest.approx(2e-3) and parts["overlapped_comm_s"] is None
    assert parts["compute_s"] == pytest.approx(6e-3)


def test_hooks_time_the_gradients_and_the_synchronize_wait_then_go_away():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    m = {}
    with gradient_clock(model, m):
        model(torch.ones(2, 3)).sum().backward()
        assert m["first_grad"] <= m["last_grad"]
    m.clear()
    model(torch.ones(2, 3)).sum().backward()
    assert m == {}  # hooks removed

    class Waiting:
        def synchronize(self):
            return "waited"

    opt = Waiting()
    with timed_synchronize(opt, m):
        assert opt.synchronize() == "waited" and m["sync_start"] <= m["sync_end"]
    assert opt.synchronize.__func__ is Waiting.synchronize  # restored


def rank(step, compute, exposed, optimizer, overlapped=None):
    return {
        "breakdown": {
            "step_s": step,
            "compute_s": compute,
            "exposed_comm_s": exposed,
            "optimizer_s": optimizer,
            "overlapped_comm_s": overlapped or [0.0] * len(step),
        }
    }


def test_each_pair_takes_the_slowest_ranks_parts_and_other_closes_the_sum():
    fast = rank([5.0, 9.0], [3.0, 3.0], [1.0, 1.0], [0.5, 0.5])
    slow = rank([6.0, 4.0], [4.0, 2.0], [0.5, 0.5], [1.0, 1.0])
    parts = launch_parts([fast, slow])
    assert parts["step"] == [6.0, 9.0] and parts["compute_ms"] == [4.0, 3.0]
    assert parts["other_ms"] == [0.5, 4.5]
    for i, step in enumerate(parts["step"]):
        assert sum(parts[k][i] for k in SUMMED) == pytest.approx(step)
    assert launch_parts([fast, {"tasks": {}}]) is None  # a rank without a breakdown: no breakdown
    with pytest.raises(ValueError, match="different numbers"):
        launch_parts([fast, rank([1.0], [1.0], [0.0], [0.0])])


def test_breakdown_estimates_are_medians_over_launches_with_intervals():
    launches = [launch_parts([rank([s], [s / 2], [s / 4], [s / 8])]) for s in (8.0, 16.0, 24.0)]
    est = breakdown_estimates(launches, "group", "task")
    assert est["compute_ms"].value == 8.0 and est["other_ms"].value == 2.0
    assert est["compute_ms"].low <= 8.0 <= est["compute_ms"].high
    assert breakdown_estimates([None]) == {}
