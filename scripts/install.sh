#!/usr/bin/env bash
# Set up everything paraflow needs in a virtual environment inside the checkout (idempotent):
# the Debian packages the Horovod build needs (Open MPI, CMake, a C++ compiler, Python headers)
# and the emulated cluster needs (iproute2, procps) when they are missing, the CPU build of torch
# pinned first, paraflow with its extras, and Horovod built against that torch (cached, see
# paraflow/backends/horovod/build.py).
#
# Usage: scripts/install.sh [VENV]   (default .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
TORCH_SPEC="${PARAFLOW_TORCH_SPEC:-torch==2.13.0}"

apt_install() {
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    echo "installing $* with apt-get"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

packages=()
{ command -v mpirun && command -v mpicc; } >/dev/null || packages+=(openmpi-bin libopenmpi-dev)
command -v cmake >/dev/null || packages+=(cmake)
{ command -v c++ || command -v g++; } >/dev/null || packages+=(g++)
python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
    || packages+=(python3-dev)
# The emulated cluster (paraflow cluster, make test-cluster): namespaces, links, shaping, sysctl.
{ command -v ip && command -v tc; } >/dev/null || packages+=(iproute2)
command -v sysctl >/dev/null || packages+=(procps)
{ command -v unshare && command -v hostname; } >/dev/null || packages+=(util-linux hostname)
[ ${#packages[@]} -eq 0 ] || apt_install "${packages[@]}"

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV" || { rm -rf "$VENV"; apt_install python3-venv; python3 -m venv "$VENV"; }
fi
PY="$VENV/bin/python"
# Pin torch before anything that depends on it: an unpinned torch pulls a multi-GB CUDA build.
"$PY" -m pip install -q "$TORCH_SPEC"
"$PY" -m pip install -q -e ".[mpi,horovod,fsdp,bench,test,data]"
bash scripts/build_horovod.sh "$PY"
echo "paraflow installed in $VENV"
