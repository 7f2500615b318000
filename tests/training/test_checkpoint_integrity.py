"""The CRC-32s of a checkpoint's zip archive are checked: flipped bytes and truncation are refused."""

import random
import struct
import zipfile

import pytest
import torch

import paraflow
import paraflow.training.checkpoint as checkpoint


@pytest.fixture
def backend():
    with paraflow.init("single", num_threads=1) as b:
        yield b


@pytest.fixture
def saved(backend, tmp_path):
    """A checkpoint of a 64x64 linear model and its Adam state, and the model."""
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 64)).sum().backward()
    optimizer.step()
    path = tmp_path / "ckpt.pt"
    backend.save(path, {"model": model, "optimizer": optimizer, "step": 7})
    return path, model


def weight_data_ranges(path):
    """Byte ranges (start, end) in the file holding the model's weight tensor data."""
    ranges = []
    with zipfile.ZipFile(path) as archive, open(path, "rb") as f:
        names = archive.namelist()
        for info in archive.infolist():
            if "/data/" not in info.filename:
                continue
            f.seek(info.header_offset)
            header = f.read(30)
            name_length, extra_length = struct.unpack("<HH", header[26:30])
            start = info.header_offset + 30 + name_length + extra_length
            ranges.append((start, start + info.compress_size))
    assert ranges, names
    return ranges


def fresh_state():
    model = torch.nn.Linear(64, 64)
    return {"model": model, "optimizer": torch.optim.Adam(model.parameters()), "step": 0}


def test_every_single_byte_flip_in_the_weights_is_refused(backend, saved, tmp_path):
    path, _ = saved
    original = path.read_bytes()
    ranges = weight_data_ranges(path)
    weights = sum(end - start for start, end in ranges)
    assert weights >= 64 * 64 * 4  # the weight matrix alone
    rng = random.Random(17)
    for trial in range(50):
        start, end = rng.choice(ranges)
        offset = rng.randrange(start, end)
        damaged = bytearray(original)
        damaged[offset] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(damaged))
        with pytest.raises(paraflow.CheckpointError, match=r"ckpt\.pt.*damaged: .*CRC-32") as caught:
            backend.load(path, fresh_state())
        assert str(path) in str(caught.value), (trial, offset)


@pytest.mark.parametrize("keep", [0.5, 0.99, -1, -12, -30])
def test_a_truncated_file_is_refused(backend, saved, keep):
    path, _ = saved
    data = path.read_bytes()
    cut = int(len(data) * keep) if keep > 0 else len(data) + keep
    path.write_bytes(data[:cut])
    with pytest.raises(paraflow.CheckpointError, match=r"could not read checkpoint .*ckpt\.pt"):
        backend.load(path, fresh_state())


def test_the_untouched_file_loads_exactly(backend, saved):
    path, model = saved
    state = fresh_state()
    rest = backend.load(path, state)
    assert rest == {"step": 7}
    for key, value in model.state_dict().items():
        assert torch.equal(state["model"].state_dict()[key], value)


def test_the_file_is_a_plain_torch_file(saved):
    path, _ = saved
    assert torch.load(path, weights_only=True)["state"]["step"] == 7


def test_a_checkpoint_of_the_first_format_loads(backend, tmp_path):
    model = torch.nn.Linear(3, 2)
    payload = {
        "paraflow": {"format": 1, "backend": "single", "world_size": 1},
        "state": {"model": model.state_dict(), "step": 3},
        "rng": [checkpoint.capture_rng_state(torch.device("cpu"))],
    }
    torch.save(payload, tmp_path / "old.pt")
    state = {"model": torch.nn.Linear(3, 2)}
    assert backend.load(tmp_path / "old.pt", state) == {"step": 3}
    assert torch.equal(state["model"].weight, model.weight)
