"""A communication failure that leaves the training loop (DDP's backward) names the silent rank."""

import pytest

import paraflow
from paraflow.environment.launchers import ProcessEnvironment
from paraflow.errors import CollectiveError, CollectiveTimeoutError
from paraflow.reliability.translation import translate_escaped_error

GLOO_TIMEOUT = "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 10000ms for recv"
GLOO_CLOSED = "[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [198.18.0.2]:5123"


class _Backend:
    rank, world_size, name, timeout = 0, 2, "ddp-gloo", 10.0


def test_gloo_timeout_in_backward_names_the_other_rank():
    err = translate_escaped_error(_Backend(), RuntimeError(GLOO_TIMEOUT))
    assert isinstance(err, CollectiveTimeoutError)
    assert "gradient allreduce" in str(err) and "rank 0 of 2" in str(err)
    assert "rank 1 did not join" in str(err) and "cannot be reached" in str(err)


def test_lost_connection_in_backward_names_the_other_rank():
    err = translate_escaped_error(_Backend(), RuntimeError(GLOO_CLOSED))
    assert type(err) is CollectiveError and "connection to rank 1 was lost" in str(err)


@pytest.mark.parametrize("text", ["DataLoader timed out after 5 seconds", "Connection closed by my own server"])
def test_a_users_own_error_is_left_alone(text):
    assert translate_escaped_error(_Backend(), RuntimeError(text)) is None


def test_leaving_the_with_block_raises_the_translation_chained_to_the_original():
    backend = paraflow.get_backend("ddp-gloo")
    backend.env = ProcessEnvironment("torchrun", rank=1, world_size=2, local_rank=0, local_world_size=1)
    original = RuntimeError(GLOO_TIMEOUT)
    with pytest.raises(CollectiveTimeoutError, match="rank 1 of 2.*rank 0 did not join") as info:
        backend.__exit__(RuntimeError, original, None)  # as `with` would, without starting a process group
    assert info.value.__cause__ is original
    assert backend.__exit__(RuntimeError, RuntimeError("a bug of the user's"), None) is None  # re-raised as it is
