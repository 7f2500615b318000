"""Errors name the call the user made, the rank and the cause, never what happened to fail inside.

Timeouts inside ``save`` / ``load`` / DDP's ``wrap_model``, launcher variables without rank 0's
address, files that are not checkpoints, RNG entries that cannot be restored, a full disk, and a
model wrapped twice.
"""

import errno

import pytest
import torch
from conftest import requires_horovod  # noqa: F401  (keeps the conftest import first)
from faultkit import TIMEOUT_S, events, run_worker

import paraflow
import paraflow.training.checkpoint as checkpoint

TIMEOUT_CASES = {
    "save": "backend.save of checkpoint ",
    "load": "backend.load of checkpoint ",
    "wrap_model": "wrap_model (DDP's broadcast of rank 0's parameters and buffers)",
}


def run_case(case, tmp_path):
    result = run_worker("torchrun", 2, "messages.py", "ddp-gloo", case, tmp_path, timeout=150)
    seen = events(result.stdout)
    errors = [e for e in seen if e.get("rank") == 0 and e.get("case") == case and "type" in e]
    assert errors, f"rank 0 reported nothing:\n{result.stdout}\n{result.stderr[-3000:]}"
    return seen, errors[0]


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    "case", ["save", pytest.param("load", marks=pytest.mark.soak), "wrap_model"]
)  # load: the same wrapper as save
def test_a_timeout_inside_a_call_names_that_call_the_rank_and_the_silent_rank(case, tmp_path):
    seen, error = run_case(case, tmp_path)
    assert error["type"] == "CollectiveTimeoutError", error
    message = error["message"]
    assert message.startswith(TIMEOUT_CASES[case]), message
    assert "on rank 0 of 2 (backend ddp-gloo) timed out: rank 1 did not join it" in message, message
    assert f"timeout of {TIMEOUT_S} s" in message, message
    skipped = [e for e in seen if e.get("skipping")][0]
    assert error["time"] - skipped["time"] <= TIMEOUT_S + 10
    if case == "save":  # the same launch checks wrapping twice on both ranks
        twice = [e for e in seen if e.get("case") == "twice"]
        assert sorted(e["rank"] for e in twice) == [0, 1], seen
        for outcome in twice:
            assert outcome["type"] == "ConfigurationError", outcome
            assert "already wrapped (DistributedDataParallel)" in outcome["message"], outcome


def test_torchrun_variables_without_rank_zeros_address(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(paraflow.LauncherError) as caught:
        paraflow.init("ddp-gloo", timeout=TIMEOUT_S)
    message = str(caught.value)
    assert "MASTER_ADDR and MASTER_PORT are not" in message and "rank 1 cannot find rank 0" in message, message
    assert "torchrun --nproc_per_node 2" in message


@pytest.fixture
def single():
    with paraflow.init("single", num_threads=1) as backend:
        yield backend


@pytest.mark.parametrize(
    "content, phrase",
    [
        (b"hello, not a checkpoint\n", "it is not a checkpoint: backend.save writes a zip archive"),
        (b"", "the file is empty"),
        (b"PK\x03\x04" + b"\0" * 100, "it is truncated or damaged (104 bytes; BadZipFile: "),
    ],
    ids=["text", "empty", "zip-header-only"],
)
def test_a_file_that_is_not_a_checkpoint_says_so(single, tmp_path, content, phrase):
    path = tmp_path / "notes.pt"
    path.write_bytes(content)
    with pytest.raises(paraflow.CheckpointError) as caught:
        single.load(path)
    message = str(caught.value)
    assert message.startswith(f"could not read checkpoint {path} on rank(s) [0]: {phrase}"), message


@pytest.mark.parametrize(
    "part, value",
    [("python", (3, tuple([2**40] * 625), None)), ("python", "junk"), ("torch", torch.zeros(3, dtype=torch.uint8))],
    ids=["python-overflow", "python-junk", "torch-short"],
)
def test_an_rng_entry_that_cannot_be_restored_is_named_and_nothing_is_changed(single, tmp_path, part, value):
    path = tmp_path / "ckpt.pt"
    model = torch.nn.Linear(3, 2)
    single.save(path, {"model": model})
    payload = torch.load(path, weights_only=True)
    payload["rng"][0][part] = value
    torch.save(payload, path)  # a well-formed file (valid CRC-32s) with a bad RNG entry
    target = torch.nn.Linear(3, 2)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(paraflow.CheckpointError) as caught:
        single.load(path, {"model": target})
    message = str(caught.value)
    assert "the RNG state saved by rank 0 cannot be restored (" in message and "restore_rng=False" in message, message
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())


class FullDisk:
    """A file whose writes fail with ENOSPC once `limit` bytes have been written."""

    def __init__(self, f, limit):
        self._f, self._left = f, limit

    def write(self, data):
        size = memoryview(data).nbytes
        if size > self._left:
            raise OSError(errno.ENOSPC, "No space left on device")
        self._left -= size
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)


def test_a_full_disk_is_named_in_the_message_not_only_in_the_chained_cause(single, tmp_path, monkeypatch):
    serialize = checkpoint._serialize
    monkeypatch.setattr(checkpoint, "_serialize", lambda payload, f: serialize(payload, FullDisk(f, 2000)))
    with pytest.raises(paraflow.CheckpointError) as caught:
        single.save(tmp_path / "ckpt.pt", {"weights": torch.ones(10_000)})
    message = str(caught.value)
    assert "[Errno 28] No space left on device" in message and "MiB free there" in message, message
    assert "unexpected pos" not in message


def test_dp_wrapped_twice_is_refused():
    with paraflow.init("dp", num_threads=1) as backend:
        model = backend.wrap_model(torch.nn.Linear(2, 2))
        with pytest.raises(paraflow.ConfigurationError, match=r"already wrapped \(nn.DataParallel\)"):
            backend.wrap_model(model)
