"""`paraflow run --elastic MIN:MAX` builds the elastic command of the backend's launcher (nothing runs)."""

from __future__ import annotations

import re

import pytest

from paraflow.errors import ConfigurationError
from paraflow.tools.run import plan_run


def plan(backend: str, elastic: str, nproc=None, launcher: str = "auto"):
    return plan_run(
        ["train.py", "--elastic"], nproc, backend, launcher, must_exist=False, elastic=elastic, job_dir="/jobs/1"
    )


def test_horovod_gets_horovodrun_elastic_mode_with_a_discovery_script_that_names_the_host_per_slot():
    p = plan("horovod", "1:2")
    ((host, argv),) = p.commands
    assert host is None and p.env["PARAFLOW_BACKEND"] == "horovod"
    assert argv[0].endswith("horovodrun") and argv[argv.index("-np") + 1] == "2"
    assert argv[argv.index("--min-np") + 1] == "1" and argv[argv.index("--max-np") + 1] == "2"
    script = argv[argv.index("--host-discovery-script") + 1]
    assert argv[-2:] == ["train.py", "--elastic"]
    slots = re.findall(r"^echo (\S+):(\d+)$", p.files[script], flags=re.M)
    assert sum(int(n) for _, n in slots) == 2 and len({name for name, _ in slots}) == 2
    assert sum(int(n) for n in re.findall(r":(\d+)$", plan("horovod", "2:5").files[script], flags=re.M)) == 5


def test_ddp_gets_torchrun_with_restarts_and_a_c10d_rendezvous():
    p = plan("ddp-gloo", "1:2", nproc=2)
    ((_, argv),) = p.commands
    assert argv[1:3] == ["-m", "torch.distributed.run"] and p.files == {}
    assert argv[argv.index("--max-restarts") + 1] == "3"
    assert argv[argv.index("--rdzv-backend") + 1] == "c10d" and argv[argv.index("--nproc_per_node") + 1] == "2"


@pytest.mark.parametrize(
    ("backend", "elastic", "nproc", "launcher", "says"),
    [
        ("horovod", "1:2", None, "mpirun", "cannot replace a lost worker"),
        ("ddp-gloo", "2:1", None, "auto", "1 <= MIN <= MAX"),
        ("ddp-gloo", "one:two", None, "auto", "MIN:MAX"),
        ("ddp-gloo", "2:4", 1, "auto", "outside --elastic 2:4"),
        ("single", "1:2", None, "auto", "no elastic launcher"),
    ],
)
def test_what_cannot_be_elastic_is_refused_saying_why(backend, elastic, nproc, launcher, says):
    with pytest.raises(ConfigurationError, match=re.escape(says)):
        plan(backend, elastic, nproc, launcher)
