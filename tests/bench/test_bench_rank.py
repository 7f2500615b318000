"""What each rank does before and around its timed steps: warm-up, the overhead's pairs."""

import os

import pytest

from paraflow.bench.rank.train_loop import settled


def test_warm_up_ends_when_step_times_settle():
    assert not settled([1.0] * 9)  # too few to compare two windows of 5
    assert settled([9.0, 5.0, 1.0, 1.05, 0.98, 1.0, 1.02, 0.99, 1.0, 1.01])
    assert not settled([5.0, 4.0, 3.0, 3.0, 3.0, 1.0, 1.0, 1.0, 1.0, 1.0])  # still falling
    assert settled([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.05, 1.05, 1.08])  # within 10%


def test_overhead_pairs_fit_the_time_budget_on_the_slowest_rank():
    import torch

    from paraflow.bench.rank.overhead import MIN_PAIRS, pairs_within

    class Backend:  # the other rank's round took 0.2 s
        def allreduce(self, tensor, op):
            assert op == "max"
            return torch.maximum(tensor, torch.tensor([0.2], dtype=torch.float64))

    assert pairs_within(Backend(), 240, 0.05, 20.0) == 100  # 20 s / 0.2 s, not 20 s / 0.05 s
    assert pairs_within(Backend(), 240, 0.05, 100.0) == 240  # never more than asked
    assert pairs_within(Backend(), 240, 0.05, 1.0) == MIN_PAIRS  # never fewer than 20 blocks of 3
    assert pairs_within(Backend(), 6, 0.05, 1.0) == 6  # unless fewer were asked


def test_overhead_models_are_built_and_stepped_in_shuffled_orders_the_same_on_every_rank():
    """Identical models step at different speeds by where their memory landed (the first built was
    often the slowest): each side gets INSTANCES of them, built and stepped in shuffled orders that
    every rank draws alike from the seed (DDP's and horovod's steps are collectives)."""
    import random

    from paraflow.bench.rank.overhead import INSTANCES, SIDES, build_order, step_orders
    from paraflow.bench.report.outputs import DEFINITIONS

    everyone = sorted((side, j) for side in SIDES for j in range(INSTANCES))
    assert INSTANCES > 1
    builds = [build_order(random.Random(seed)) for seed in range(20)]
    assert all(sorted(order) == everyone for order in builds)  # every model once
    assert build_order(random.Random(7)) == build_order(random.Random(7))  # alike on every rank
    assert {order[0][0] for order in builds} == set(SIDES)  # no side always built first
    rounds = step_orders(random.Random(3), 30)
    assert rounds == step_orders(random.Random(3), 30) and len(rounds) == 30
    assert all(sorted(order) == everyone for order in rounds)
    assert len({tuple(order) for order in rounds}) > 20  # a fresh order each round
    assert any(f"{INSTANCES} models" in line for line in DEFINITIONS)  # results.md says how many


def test_worker_skips_interpreter_teardown_except_under_mpi(monkeypatch):
    from paraflow.bench.rank import worker

    exits = []
    monkeypatch.setattr(worker.os, "_exit", exits.append)
    for key in [k for k in os.environ if k.startswith(("OMPI_", "PMI", "PMIX_"))]:
        monkeypatch.delenv(key)
    worker.leave(3)
    assert exits == [3]  # straight out, once the rank file is written
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
    with pytest.raises(SystemExit) as exited:  # MPI_Finalize must run at interpreter exit
        worker.leave(4)
    assert exited.value.code == 4 and exits == [3]
