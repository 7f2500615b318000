"""The horovod build's CUDA decision and its failure messages, without building horovod."""

from __future__ import annotations

import subprocess
import sys

import pytest

from paraflow.backends.horovod import build
from paraflow.backends.horovod.build_failure import HorovodBuildError, diagnose
from paraflow.backends.horovod.gpu_build import GpuChoice, cuda_toolkit, gpu_choice, nccl_found
from paraflow.environment.mpi_library import find_tool

NO_ENV: dict = {}

# Horovod 0.28.1's CUDA lookups, cut down: an nvcc on PATH (check_language), the toolkit search, and
# FindPytorch's CUDA answer (here always a CUDA torch, as if torch.version.cuda were set).
PROJECT = """cmake_minimum_required(VERSION 3.13)
project(horovod CXX)
set(CMAKE_MODULE_PATH ${CMAKE_MODULE_PATH} "${PROJECT_SOURCE_DIR}/cmake/Modules/")
include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
    find_package(CUDAToolkit)
endif()
find_package(Pytorch)
message(STATUS "cuda compiler '${CMAKE_CUDA_COMPILER}' toolkit '${CUDAToolkit_BIN_DIR}' torch cuda '${Pytorch_CUDA}'")
"""
FIND_PYTORCH = """set(Pytorch_CUDA "True")
string(TOUPPER "${Pytorch_CUDA}" Pytorch_CUDA)
set(PYTORCH_FOUND TRUE)
"""


@pytest.fixture
def partial_cuda(tmp_path, monkeypatch):
    """This machine's case: an nvcc on PATH (it notes each call) and a CUDA directory with no runtime."""
    cuda = tmp_path / "cuda-13.0"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "include").mkdir()
    (cuda / "include" / "cuda_runtime.h").write_text("")
    nvcc = cuda / "bin" / "nvcc"
    nvcc.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/nvcc-called\nexit 1\n')
    nvcc.chmod(0o755)
    monkeypatch.setenv("PATH", f"{cuda / 'bin'}:{tmp_path / 'none'}:/usr/bin:/bin")
    for name in ("HOROVOD_CUDA_HOME", "CUDA_HOME", "CUDA_PATH", "CUDACXX", "PARAFLOW_HOROVOD_GPU"):
        monkeypatch.delenv(name, raising=False)
    return cuda


def test_a_cuda_directory_without_the_runtime_library_is_no_toolkit(partial_cuda):
    nowhere = str(partial_cuda.parent / "no-cuda")
    assert cuda_toolkit(default_root=nowhere) == (None, f"{partial_cuda} has no CUDA runtime library (libcudart)")
    (partial_cuda / "lib64").mkdir()
    (partial_cuda / "lib64" / "libcudart.so.13").write_text("")
    assert cuda_toolkit(default_root=nowhere) == (str(partial_cuda), "")


@pytest.mark.parametrize(
    "torch_cuda, gpu_visible, toolkit, enabled, reason",
    [
        (None, False, ("/usr/local/cuda", ""), False, "torch is a CPU build"),
        (None, True, ("/usr/local/cuda", ""), False, "torch is a CPU build"),
        ("13.0", False, ("/usr/local/cuda", ""), False, "sees no GPU here, no CUDA runtime"),
        ("13.0", True, (None, "/c has no bin/nvcc"), False, "no complete CUDA toolkit for torch's CUDA 13.0: /c has"),
        ("13.0", True, ("/usr/local/cuda", ""), True, "torch's CUDA 13.0 build and the toolkit at /usr/local/cuda"),
    ],
)
def test_gpu_operations_need_a_cuda_torch_a_gpu_and_a_complete_toolkit(
    torch_cuda, gpu_visible, toolkit, enabled, reason
):
    choice = gpu_choice(torch_cuda, gpu_visible, NO_ENV, lambda: toolkit, lambda root, env: True)
    assert choice.enabled is enabled and reason in choice.reason
    if enabled:
        assert choice.build_env() == {
            "HOROVOD_GPU_OPERATIONS": "NCCL",
            "HOROVOD_CUDA_HOME": "/usr/local/cuda",
            "CUDAToolkit_ROOT": "/usr/local/cuda",
        }
    else:
        assert choice.build_env() == {"HOROVOD_GPU_OPERATIONS": ""}


def test_nccl_is_taken_where_it_is_found(tmp_path):
    toolkit = lambda: (str(tmp_path), "")  # noqa: E731
    assert gpu_choice("13.0", True, NO_ENV, toolkit).operations == ""
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "nccl.h").write_text("")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libnccl.so.2").write_text("")
    assert gpu_choice("13.0", True, NO_ENV, toolkit).operations == "NCCL"
    assert nccl_found("/nowhere", {"HOROVOD_NCCL_HOME": str(tmp_path)})


def test_paraflow_horovod_gpu_forces_either_way():
    toolkit = lambda: ("/opt/cuda", "")  # noqa: E731
    assert gpu_choice("13.0", False, {"PARAFLOW_HOROVOD_GPU": "1"}, toolkit).enabled
    assert not gpu_choice("13.0", True, {"PARAFLOW_HOROVOD_GPU": "0"}, toolkit).enabled
    asked = gpu_choice("13.0", True, {"HOROVOD_GPU_OPERATIONS": "MPI"}, toolkit)
    assert asked.operations == "MPI"
    with pytest.raises(ValueError, match="PARAFLOW_HOROVOD_GPU=yes"):
        gpu_choice("13.0", True, {"PARAFLOW_HOROVOD_GPU": "yes"}, toolkit)


def test_this_torch_here_gets_a_build_without_gpu_operations(partial_cuda):
    choice = build.build_gpu(sys.executable)
    import torch

    assert choice.enabled is (bool(torch.version.cuda) and torch.cuda.is_available() and choice.toolkit is not None)
    key = build.cache_key(sys.executable, gpu=choice)
    assert f"-torch{torch.__version__}-" in key and key.endswith(("-nccl", "-cuda", "-mpi")) is choice.enabled


@pytest.mark.skipif(find_tool("cmake") is None, reason="needs cmake")
@pytest.mark.parametrize("choice", [GpuChoice(False, "torch is a CPU build"), None])
def test_a_build_without_gpu_operations_never_calls_nvcc_even_with_a_cuda_torch(partial_cuda, tmp_path, choice):
    source = tmp_path / "horovod"
    (source / "cmake" / "Modules").mkdir(parents=True)
    (source / "CMakeLists.txt").write_text(PROJECT)
    (source / "cmake" / "Modules" / "FindPytorch.cmake").write_text(FIND_PYTORCH)
    wrapper_dir = tmp_path / "wrapper"
    wrapper_dir.mkdir()
    # The build's own cmake wrapper; None is the control: plain cmake, as before this choice existed.
    cmake = build._cmake_wrapper(wrapper_dir, find_tool("cmake"), choice) if choice else find_tool("cmake")
    done = subprocess.run(
        [str(cmake), "-S", str(source), "-B", str(tmp_path / "out")], capture_output=True, text=True, timeout=120
    )
    called = (tmp_path / "nvcc-called").exists()
    if choice is None:
        assert called and "torch cuda 'TRUE'" in done.stdout  # the test sees CUDA being tried
    else:
        assert done.returncode == 0, done.stdout + done.stderr
        assert not called and "cuda compiler '' toolkit '' torch cuda 'FALSE'" in done.stdout


@pytest.mark.parametrize(
    "line, cause",
    [
        ("  Could NOT find CUDAToolkit (missing: CUDAToolkit_INCLUDE_DIR CUDA_CUDART)", "CUDA"),
        ('  Could NOT find MPI (missing: MPI_CXX_FOUND) (found version "3.1")', "MPI"),
        ("  No CMAKE_CXX_COMPILER could be found.", "compiler"),
        ("horovod/torch/mpi_ops_v2.cc:12:10: error: 'optional' in namespace 'std' does not name a type", "compiler"),
        ("CMake Error at CMakeLists.txt:1 (cmake_minimum_required):", "CMake"),
    ],
)
def test_a_failed_build_is_named_by_its_cause(line, cause):
    log = "\n".join(
        ["-- noise"] * 150 + ["CMake Error at CMakeLists.txt:163 (find_package):", line] + ["-- more"] * 150
    )
    found, shown, fix = diagnose(log)
    assert found == cause and (shown == line.strip() or cause == "CMake") and "--force" in fix


FAILING_PIP = """#!/bin/sh
[ "$3" = wheel ] || exit 0
i=0; while [ $i -lt 300 ]; do echo "-- line $i"; i=$((i+1)); done
echo "  Could NOT find CUDAToolkit (missing: CUDAToolkit_INCLUDE_DIR CUDA_CUDART)"
exit 1
"""


def test_a_failed_build_ends_in_a_short_message_with_the_log(tmp_path, monkeypatch, capsys):
    python = tmp_path / "python"
    python.write_text(FAILING_PIP)
    python.chmod(0o755)
    choice = GpuChoice(False, "torch is a CPU build")
    with pytest.raises(HorovodBuildError) as err:
        build.build_wheel(str(python), tmp_path / "wheels", gpu=choice)
    message = str(err.value)
    assert message.startswith("building horovod failed (CUDA): Could NOT find CUDAToolkit")
    assert "PARAFLOW_HOROVOD_GPU=0" in message and f"the whole log: {tmp_path / 'wheels' / 'build.log'}" in message
    assert len(message.splitlines()) == 3 and "-- line 299" in (tmp_path / "wheels" / "build.log").read_text()

    monkeypatch.setenv("PARAFLOW_WHEEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "probe", lambda python: {"version": None})
    monkeypatch.setattr(build, "missing_tools", lambda python: [])

    def failing_build(*args):
        raise err.value

    monkeypatch.setattr(build, "build_wheel", failing_build)
    assert build.build_and_install(sys.executable) == 1
    said = capsys.readouterr()
    assert said.err == f"error: {message}\n" and "horovod without GPU operations" in said.out
