"""Ports of Horovod's well-known PyTorch examples (docs/examples/horovod_*.py), written in its idiom,
run with only their import changed to paraflow.compat.horovod, on ddp-gloo, and train what they
train under Horovod itself."""

import re

import pytest
from conftest import ROOT, launch_ok, requires_horovod

pytestmark = [pytest.mark.long, pytest.mark.xdist_group("horovod-examples"), pytest.mark.timeout(400)]

EXAMPLES = ROOT / "docs" / "examples"
IMPORT = "\nimport horovod.torch as hvd\n"


def drop_in(tmp_path, name):
    """The example with only its import changed."""
    text = (EXAMPLES / name).read_text()
    assert text.count(IMPORT) == 1
    script = tmp_path / name
    script.write_text(text.replace(IMPORT, "\nimport paraflow.compat.horovod as hvd\n"))
    return script


def run(tmp_path, name, *args, horovod=False):
    if horovod:
        return launch_ok("mpirun", 2, [EXAMPLES / name, *args], timeout=300).stdout
    return launch_ok(
        "torchrun", 2, [drop_in(tmp_path, name), *args], timeout=300, env={"PARAFLOW_BACKEND": "ddp-gloo"}
    ).stdout


def lines(output, pattern):
    found = re.findall(pattern, output, flags=re.M)
    assert found, f"no line matches {pattern!r}:\n{output[-3000:]}"
    return found


@pytest.fixture(scope="module")
def mnist(tmp_path_factory):
    return run(tmp_path_factory.mktemp("mnist"), "horovod_mnist.py", "--epochs", "2")


def test_the_mnist_example_learns_the_digits_with_only_its_import_changed(mnist):
    accuracies = [float(a) for a in lines(mnist, r"Accuracy: ([\d.]+)%")]
    assert len(accuracies) == 2 and accuracies[-1] > 50, accuracies  # ten classes: 10 % by chance


@requires_horovod
def test_the_mnist_example_trains_horovods_model(mnist):
    horovod = run(None, "horovod_mnist.py", "--epochs", "2", horovod=True)
    pattern = r"^(Test set: .*|weights sum .*)$"
    assert lines(mnist, pattern) == lines(horovod, pattern)


def test_the_synthetic_benchmark_runs_with_only_its_import_changed(tmp_path):
    out = run(tmp_path, "horovod_synthetic_benchmark.py", "--num-warmup-batches", "1", "--num-iters", "2",
              "--num-batches-per-iter", "2", "--batch-size", "8")  # fmt: skip
    assert len(lines(out, r"^Iter #\d: [\d.]+ img/sec per CPU$")) == 2
    assert lines(out, r"^Total img/sec on 2 CPU\(s\): [\d.]+ \+-[\d.]+$")


@requires_horovod
def test_the_imagenet_example_trains_horovods_model_and_resumes_from_its_checkpoint(tmp_path):
    small = ["--images", "32", "--epochs", "1"]
    checkpoints = tmp_path / "drop-in"
    checkpoints.mkdir()
    ours = run(tmp_path, "horovod_imagenet_resnet.py", *small, "--checkpoint-format", f"{checkpoints}/ck-{{epoch}}.pt")
    theirs = run(None, "horovod_imagenet_resnet.py", *small, "--checkpoint-format", f"{tmp_path}/ck-{{epoch}}.pt",
                 horovod=True)  # fmt: skip
    pattern = r"^((?:Train|Validate) Epoch .*|weights sum .*)$"
    assert lines(ours, pattern) == lines(theirs, pattern)
    assert len(lines(ours, r"^Train Epoch #\d")) == 1
    resumed = run(tmp_path, "horovod_imagenet_resnet.py", "--images", "32", "--epochs", "2",
                  "--checkpoint-format", f"{checkpoints}/ck-{{epoch}}.pt")  # fmt: skip
    assert lines(resumed, r"^Train Epoch #(\d)") == ["2"]  # the resume epoch, broadcast from rank 0
