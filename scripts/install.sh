#!/usr/bin/env bash
# Set up everything paraflow needs in a virtual environment inside the checkout (idempotent):
# Open MPI from Debian when mpirun is missing, the CPU build of torch pinned first, paraflow
# with its extras, and Horovod built against that torch (cached, see build_horovod.sh).
#
# Usage: scripts/install.sh [VENV]   (default .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
TORCH_SPEC="${PARAFLOW_TORCH_SPEC:-torch==2.13.0}"

if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    echo "installing Open MPI (openmpi-bin libopenmpi-dev) with apt-get"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
fi

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
# Pin torch before anything that depends on it: an unpinned torch pulls a multi-GB CUDA build.
"$PY" -m pip install -q "$TORCH_SPEC"
"$PY" -m pip install -q -e ".[mpi,bench,test,data]"
bash scripts/build_horovod.sh "$PY"
echo "paraflow installed in $VENV"
