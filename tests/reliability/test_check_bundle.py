"""When a repeated allreduce carries the cross-rank check (check_bundle.py); its results and
mismatches are tested with the board's in test_repeated_call_check.py."""

from types import SimpleNamespace

import pytest
import torch

from paraflow.reliability.check_bundle import BUNDLE_AFTER, BUNDLE_MAX_BYTES, bundle_spec, forget_agreed, note_agreed


def backend(bundles=True):
    return SimpleNamespace(_bundles_checks=bundles)


def spec(numel, dtype=torch.float32, collective="allreduce"):
    return (collective, dtype, (numel,), "sum", None)


def test_bundling_starts_after_a_run_of_the_same_agreed_allreduce():
    b = backend()
    for i in range(BUNDLE_AFTER):
        assert bundle_spec(b, 4096) is None, i
        note_agreed(b, "key", spec(5000))
    assert bundle_spec(b, 4096) == ("key", spec(5000))
    note_agreed(b, "other", spec(5000))  # another call in between starts the run again
    assert bundle_spec(b, 4096) is None
    forget_agreed(b)
    assert bundle_spec(b, 4096) is None


@pytest.mark.parametrize(
    "why, b, agreed",
    [
        ("carried in the frame", backend(), spec(1000)),
        ("too large: copying costs more than the frame", backend(), spec(BUNDLE_MAX_BYTES // 4 + 1)),
        ("not an allreduce", backend(), spec(5000, collective="broadcast")),
        ("a dtype without exact small integers", backend(), spec(5000, torch.int8)),
        ("a backend that does not bundle (horovod, NCCL)", backend(bundles=False), spec(5000)),
    ],
)
def test_what_is_never_bundled(why, b, agreed):
    for _ in range(BUNDLE_AFTER):
        note_agreed(b, "key", agreed)
    assert bundle_spec(b, 4096) is None, why
