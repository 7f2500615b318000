"""Uneven inputs: with backend.join, ranks running different numbers of batches finish together."""

import pytest
from conftest import WORKERS, launch_ok, read_rank_json, requires_horovod

SKEWS = (1, 3)


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "backend, launcher", [("ddp-gloo", "torchrun"), pytest.param("horovod", "mpirun", marks=requires_horovod)]
)
def test_skewed_ranks_finish_with_the_same_model_and_optimizer(tmp_path, backend, launcher):
    # The worker's collectives time out after 60 s; a hang fails this launch after 150 s.
    launch_ok(launcher, 2, [WORKERS / "uneven.py", backend, tmp_path, *SKEWS], timeout=150)
    first, second = read_rank_json(tmp_path, 2)
    for skew in map(str, SKEWS):
        assert second[skew]["batches"] - first[skew]["batches"] == int(skew)
        # Rank 0 stopped early; it leaves the join with the last rank's model and momentum.
        assert first[skew]["params"] == second[skew]["params"], f"skew {skew}: parameters differ"
        assert first[skew]["momentum"] == second[skew]["momentum"], f"skew {skew}: optimizer state differs"


def test_join_is_a_no_op_for_one_process_backends():
    import torch

    import paraflow

    with paraflow.init("single") as backend:
        model = backend.wrap_model(torch.nn.Linear(2, 2))
        with backend.join(model, torch.optim.SGD(model.parameters(), lr=0.1)):
            model(torch.ones(1, 2)).sum().backward()
