"""Which MPI: the one behind an mpicc (the horovod wheel cache's key), a launcher's family, mismatches."""

import os
import stat
import sys

import pytest

from paraflow.environment.mpi_library import first_line, launcher_family, mpi_family, wrapper_mpi
from paraflow.tools.check import _mismatch
from paraflow.tools.launch import mpirun_prefix

MPICH_TEXT = "MPICH Version:      5.0.2\nMPICH Release date: Fri Sep 25 2026\nMPICH ABI: 18:2:6\n"
OPENMPI_TEXT = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022"


def _script(path, text: str) -> None:
    path.write_text(f"#!/bin/sh\ncat <<'END'\n{text}END\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def mpich_bin(tmp_path):
    """A directory holding what the `mpich` wheel puts in a venv's bin: mpicc, mpichversion, mpirun."""
    for name in ("mpicc", "mpirun"):
        _script(tmp_path / name, "")
    _script(tmp_path / "mpichversion", MPICH_TEXT)
    return tmp_path


def test_a_pypi_mpich_beside_the_python_is_named_with_its_version_and_source(mpich_bin):
    mpi = wrapper_mpi(str(mpich_bin / "python"))
    assert (mpi.family, mpi.version, mpi.source, mpi.mpicc) == ("mpich", "5.0.2", "pypi", str(mpich_bin / "mpicc"))
    assert mpi.key.startswith("mpich5.0.2-pypi-") and len(mpi.key.rsplit("-", 1)[1]) == 8


def test_an_mpicc_on_path_is_the_system_mpi(mpich_bin, tmp_path_factory, monkeypatch):
    elsewhere = tmp_path_factory.mktemp("venv-bin")
    monkeypatch.setenv("PATH", f"{mpich_bin}{os.pathsep}{os.environ['PATH']}")
    mpi = wrapper_mpi(str(elsewhere / "python"))
    assert (mpi.family, mpi.source) == ("mpich", "system")


def test_two_installations_of_one_mpi_get_two_keys(mpich_bin, tmp_path_factory):
    other = tmp_path_factory.mktemp("other-venv-bin")
    for name in ("mpicc", "mpichversion"):
        (other / name).write_bytes((mpich_bin / name).read_bytes())
        (other / name).chmod(0o755)
    assert wrapper_mpi(str(other / "python")).key != wrapper_mpi(str(mpich_bin / "python")).key


def test_no_mpicc_anywhere_is_none(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert wrapper_mpi(str(tmp_path / "python")) is None


@pytest.mark.skipif(not os.path.exists("/usr/bin/ompi_info"), reason="needs Debian's Open MPI")
def test_debians_open_mpi_is_recognised():
    mpi = wrapper_mpi("/nonexistent/bin/python")
    assert (mpi.family, mpi.source) == ("openmpi", "system") and mpi.version[0].isdigit()


def test_library_texts_give_the_family():
    assert mpi_family(MPICH_TEXT) == "mpich"
    assert mpi_family(OPENMPI_TEXT) == "openmpi"
    assert mpi_family("Intel(R) MPI Library 2021.10 for Linux") == "mpich"
    assert mpi_family(None) is None and mpi_family("Something else 1.0") is None
    assert first_line(MPICH_TEXT) == "MPICH Version: 5.0.2"
    assert first_line(OPENMPI_TEXT) == "Open MPI v4.1.4"


def test_mpich_mpirun_gets_no_open_mpi_flags(mpich_bin, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(mpich_bin / "python"))  # find_tool looks beside it first
    assert launcher_family(str(mpich_bin / "mpirun")) == "mpich"
    assert mpirun_prefix(2, env_keys=["A"]) == [str(mpich_bin / "mpirun"), "-np", "2"]
    assert mpirun_prefix(2, hosts="h1:1,h2:1") == [str(mpich_bin / "mpirun"), "-np", "2", "-hosts", "h1:1,h2:1"]


def _report(mpi4py=None, horovod=None, mpirun=None) -> dict:
    return {"mpi4py_library": mpi4py, "horovod_library": horovod, "mpirun_family": mpirun}


def test_check_says_when_mpi4py_horovod_and_mpirun_differ():
    assert _mismatch(_report(first_line(OPENMPI_TEXT), first_line(OPENMPI_TEXT), "openmpi")) is None
    assert _mismatch(_report(first_line(MPICH_TEXT), first_line(MPICH_TEXT), "mpich")) is None
    assert _mismatch(_report(None, None, "openmpi")) is None
    said = _mismatch(_report(first_line(MPICH_TEXT), first_line(OPENMPI_TEXT), "openmpi"))
    assert "mpi4py: MPICH, horovod: Open MPI, mpirun: Open MPI" in said and "make install" in said
    said = _mismatch(_report("Open MPI v4.1.4", "Open MPI v5.0.3", "openmpi"))
    assert "mpi4py loads Open MPI v4.1.4, horovod Open MPI v5.0.3" in said
