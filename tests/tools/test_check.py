"""`paraflow check` / `paraflow env`: every field against what can be computed independently."""

import importlib.metadata
import json
import sys

import pytest
import torch
import torch.distributed as dist
from conftest import launch_ok, requires_horovod

import paraflow
from paraflow.environment.mpi_library import launcher_family
from paraflow.tools import check
from paraflow.tools.launch import find_tool

CHECK = ["-m", "paraflow.cli", "check", "--json"]
#: What the ranks of the mpirun found here detect: Debian's Open MPI, or a PyPI MPICH in this environment.
MPIRUN_LAUNCHER = {"mpich": "mpich"}.get(launcher_family(find_tool("mpirun") or "mpirun"), "openmpi")


def _report(result) -> list:
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def test_json_report_matches_what_torch_mpi_horovod_and_the_registry_say():
    (report,) = _report(launch_ok("python", 1, CHECK, timeout=120))
    assert report["paraflow"]["version"] == paraflow.__version__

    t = report["torch"]
    assert t["version"] == torch.__version__
    assert t["cuda_available"] == torch.cuda.is_available()
    assert len(t["cuda_devices"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert t["build"] == (f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU")
    assert (t["gloo"], t["nccl"], t["mpi"]) == (
        dist.is_gloo_available(),
        dist.is_nccl_available(),
        dist.is_mpi_available(),
    )

    m = report["mpi"]
    assert m["mpirun"] == find_tool("mpirun")  # a PyPI MPI's, beside this Python, else the one on PATH
    assert m["mismatch"] is None, m["mismatch"]
    try:
        assert m["mpi4py"] == importlib.metadata.version("mpi4py")
    except importlib.metadata.PackageNotFoundError:
        assert m["mpi4py"] is None and "pip install mpi4py" in m["mpi4py_error"]

    assert report["process"]["launcher"] == "python"
    assert (report["process"]["rank"], report["process"]["world_size"]) == (0, 1)

    backends = report["backends"]
    assert list(backends) == paraflow.registered_names()
    for name, reason in paraflow.available_backends().items():
        assert backends[name]["available"] == (reason is None) and backends[name]["reason"] == reason


@requires_horovod
def test_json_report_describes_the_horovod_build():
    import horovod.torch as hvd

    (report,) = _report(launch_ok("python", 1, CHECK, timeout=120))
    h = report["horovod"]
    assert h["installed"] and h["usable"] and h["reason"] is None
    assert h["version"] == importlib.metadata.version("horovod")
    assert h["built_for_torch"] == torch.__version__ and h["frameworks"]["pytorch"] is True
    assert h["controllers"] == {"mpi": bool(hvd.mpi_built()), "gloo": bool(hvd.gloo_built())}
    assert h["tensor_operations"]["nccl"] == bool(hvd.nccl_built())
    assert h["tensor_operations"]["cuda"] == bool(hvd.cuda_built())
    # The MPI horovod loads is the one mpi4py loads (both from one install).
    assert h["mpi_library"] and h["mpi_library"] == report["mpi"]["mpi4py_library"], report["mpi"]
    assert all("libmpi" in path for path in h["mpi_library_paths"])


@pytest.mark.timeout(120)
def test_under_mpirun_every_rank_reports_itself(tmp_path):
    """Each rank writes its own file: Open MPI forwards its ranks' output in chunks, and two long
    JSON lines printed at once came out interleaved."""
    launch_ok("mpirun", 2, [*CHECK, "--json-dir", tmp_path], timeout=100)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert sorted(r["process"]["rank"] for r in reports) == [0, 1]
    for r in reports:
        p = r["process"]
        assert (p["launcher"], p["world_size"], p["local_world_size"], p["horovod_controller"]) == (
            MPIRUN_LAUNCHER,
            2,
            2,
            "mpi",
        )


@pytest.mark.timeout(120)
def test_text_report_is_printed_once_under_a_launcher():
    result = launch_ok("mpirun", 2, ["-m", "paraflow.cli", "env"], timeout=100)
    out = result.stdout
    assert out.count("backends\n") == 1 and out.count("torch        ") == 1
    assert f"launcher   {MPIRUN_LAUNCHER}: rank 0 of 2" in out
    assert "rank 1 of 2 (local 1 of 2)" in out  # the other rank's one line


def test_text_report_sections(capsys):
    assert check.main() == 0
    out = capsys.readouterr().out
    for heading in ("torch        ", "MPI\n", "horovod      ", "this process\n", "backends\n"):
        assert heading in out
    for name in paraflow.registered_names():
        assert f"\n  {name} " in out


def test_text_report_names_torchs_build_beside_the_mpi_facts(capsys):
    assert check.main() == 0
    out = capsys.readouterr().out
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU"
    torch_line = f"torch        {torch.__version__} ({build} build)\n"
    assert torch_line in out and out.index(torch_line) < out.index("MPI\n  mpirun ")


def test_launcher_fields_follow_the_environment(monkeypatch):
    for key, value in {
        "RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "10.1.2.3",
        "MASTER_PORT": "29400",
    }.items():
        monkeypatch.setenv(key, value)
    p = check.collect()["process"]
    assert (p["launcher"], p["rank"], p["world_size"], p["local_rank"], p["local_world_size"]) == (
        "torchrun",
        1,
        4,
        1,
        2,
    )
    assert (p["master_addr"], p["master_port"], p["horovod_controller"]) == ("10.1.2.3", 29400, "gloo")


def test_half_set_launcher_variables_are_reported_not_raised(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    report = check.collect()
    assert report["process"]["launcher"] is None and "WORLD_SIZE=2" in report["process"]["error"]
    assert "cannot tell" in check.render(report)


def test_missing_horovod_is_reported_with_the_install_command(monkeypatch):
    for name in [m for m in sys.modules if m == "horovod" or m.startswith("horovod.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "horovod", None)
    monkeypatch.setitem(sys.modules, "horovod.torch", None)
    report = check.collect()
    assert report["horovod"]["installed"] is False and report["horovod"]["usable"] is False
    assert "paraflow build-horovod" in report["horovod"]["reason"]
    assert report["backends"]["horovod"]["available"] is False
    assert "not installed" in check.render(report)
