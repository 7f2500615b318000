"""Whether horovod is built with GPU operations, decided from what this machine has, before CMake runs.

Horovod's CMake tries CUDA whenever it finds an ``nvcc`` (``check_language(CUDA)``) or torch is a CUDA
build, and stops when the toolkit is partial (``Could NOT find CUDAToolkit``). Here the decision is
made first: GPU operations only with a CUDA build of torch, a complete CUDA toolkit, and a GPU that
torch sees (``PARAFLOW_HOROVOD_GPU=1`` builds them without one, on a login node; ``=0`` never); NCCL
where it is found, unless ``HOROVOD_GPU_OPERATIONS`` names another. Otherwise CMake is kept from
looking for CUDA at all.
"""

from __future__ import annotations

import glob
import os
import shutil
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

from ...errors import ConfigurationError

__all__ = ["GpuChoice", "cuda_toolkit", "nccl_found", "gpu_choice", "cmake_include"]

#: What a CUDA toolkit needs for horovod's CUDA kernels: its compiler, the runtime's header and library.
_PARTS = {
    "bin/nvcc": ("bin/nvcc",),
    "include/cuda_runtime.h": ("include/cuda_runtime.h",),
    "CUDA runtime library (libcudart)": ("lib64/libcudart.so*", "lib/libcudart.so*", "targets/*/lib/libcudart.so*"),
}

# Keeps CMake from trying CUDA: no CUDA compiler, no CUDAToolkit search, and torch taken as a CPU
# build by horovod's FindPytorch (a CUDA torch then gets a horovod for CPU tensors, as with a CPU torch).
_NO_CUDA = r"""
set(CMAKE_CUDA_COMPILER "" CACHE FILEPATH "horovod is built without GPU operations" FORCE)
set(CMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit TRUE)
if(PROJECT_NAME STREQUAL "horovod" AND EXISTS "${PROJECT_SOURCE_DIR}/cmake/Modules/FindPytorch.cmake")
    file(READ "${PROJECT_SOURCE_DIR}/cmake/Modules/FindPytorch.cmake" _find_pytorch)
    string(REPLACE "string(TOUPPER \"\${Pytorch_CUDA}\" Pytorch_CUDA)" "set(Pytorch_CUDA FALSE)"
           _cpu_pytorch "${_find_pytorch}")
    if(_cpu_pytorch STREQUAL _find_pytorch)
        message(FATAL_ERROR "paraflow: this horovod's FindPytorch.cmake has no Pytorch_CUDA line to turn off")
    endif()
    file(WRITE "${CMAKE_BINARY_DIR}/paraflow-cmake/FindPytorch.cmake" "${_cpu_pytorch}")
    list(INSERT CMAKE_MODULE_PATH 0 "${CMAKE_BINARY_DIR}/paraflow-cmake")
endif()
"""


@dataclass(frozen=True)
class GpuChoice:
    """Whether horovod gets GPU operations, why, the toolkit, and the operations (NCCL, MPI; "": horovod's default)."""

    enabled: bool
    reason: str
    toolkit: Optional[str] = None
    operations: str = ""

    def build_env(self) -> dict[str, str]:
        """Horovod's build variables for this choice."""
        if not self.enabled:
            return {"HOROVOD_GPU_OPERATIONS": ""}
        root = self.toolkit or ""
        return {"HOROVOD_GPU_OPERATIONS": self.operations, "HOROVOD_CUDA_HOME": root, "CUDAToolkit_ROOT": root}


def cuda_toolkit(
    environ: Mapping[str, str] = os.environ,
    which: Callable[[str], Optional[str]] = shutil.which,
    default_root: str = "/usr/local/cuda",
) -> tuple[Optional[str], str]:
    """``(root, "")`` for the first complete CUDA toolkit, else ``(None, what is missing where)``.

    Looked for in HOROVOD_CUDA_HOME, CUDA_HOME, CUDA_PATH, above the ``nvcc`` on PATH, `default_root`.
    """
    roots = [environ.get(name) for name in ("HOROVOD_CUDA_HOME", "CUDA_HOME", "CUDA_PATH")]
    nvcc = which("nvcc")
    if nvcc:
        roots.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    roots.append(default_root)
    gaps = []
    for root in dict.fromkeys(r for r in roots if r and os.path.isdir(r)):
        missing = [part for part, found in _PARTS.items() if not any(glob.glob(os.path.join(root, p)) for p in found)]
        if not missing:
            return root, ""
        gaps.append(f"{root} has no {', '.join(missing)}")
    return None, "; ".join(gaps) or "no nvcc and no CUDA directory"


def nccl_found(root: str, environ: Mapping[str, str] = os.environ) -> bool:
    """True when horovod's CMake finds NCCL: its header and library in HOROVOD_NCCL_* or the toolkit at `root`."""
    homes = [h for h in (environ.get("HOROVOD_NCCL_HOME"), root) if h]
    includes = [environ.get("HOROVOD_NCCL_INCLUDE"), *(os.path.join(h, "include") for h in homes)]
    libraries = [environ.get("HOROVOD_NCCL_LIB"), *(os.path.join(h, sub) for h in homes for sub in ("lib", "lib64"))]
    header = any(os.path.exists(os.path.join(d, "nccl.h")) for d in includes if d)
    return header and any(glob.glob(os.path.join(d, "libnccl*")) for d in libraries if d)


def gpu_choice(
    torch_cuda: Optional[str],
    gpu_visible: bool,
    environ: Mapping[str, str] = os.environ,
    toolkit: Callable[[], tuple[Optional[str], str]] = cuda_toolkit,
    nccl: Callable[[str, Mapping[str, str]], bool] = nccl_found,
) -> GpuChoice:
    """Whether horovod is built with GPU operations for a torch whose CUDA version is `torch_cuda`."""
    asked = environ.get("PARAFLOW_HOROVOD_GPU", "auto").strip().lower() or "auto"
    if asked not in ("auto", "0", "1"):
        raise ConfigurationError(
            f"PARAFLOW_HOROVOD_GPU={asked}: choose auto (the default), 0 (no GPU operations) or 1 (GPU operations "
            "without a visible GPU too), e.g. `PARAFLOW_HOROVOD_GPU=0 paraflow build-horovod --force`"
        )
    if asked == "0":
        return GpuChoice(False, "PARAFLOW_HOROVOD_GPU=0")
    if not torch_cuda:
        return GpuChoice(False, "torch is a CPU build")
    if not gpu_visible and asked != "1":
        return GpuChoice(
            False,
            f"torch (CUDA {torch_cuda}) sees no GPU here, no CUDA runtime; PARAFLOW_HOROVOD_GPU=1 builds them anyway",
        )
    root, gap = toolkit()
    if root is None:
        return GpuChoice(False, f"no complete CUDA toolkit for torch's CUDA {torch_cuda}: {gap}")
    reason = f"torch's CUDA {torch_cuda} build and the toolkit at {root}"
    operations = environ.get("HOROVOD_GPU_OPERATIONS") or ("NCCL" if nccl(root, environ) else "")
    if not operations:
        reason += "; no NCCL found (HOROVOD_NCCL_HOME names it), so horovod's defaults for GPU tensors"
    return GpuChoice(True, reason, root, operations)


def cmake_include(choice: GpuChoice) -> str:
    """What the CMake project include adds for `choice`: nothing with GPU operations, else no CUDA at all."""
    return "" if choice.enabled else _NO_CUDA
