#!/usr/bin/env bash
# Build (once) and install Horovod with PyTorch, MPI and gloo support into the given Python.
#
# The work is done by `paraflow build-horovod` (paraflow/backends/horovod/build.py), so a checkout and an
# installed paraflow build the same way: horovod's C++14 request is mapped to C++17 (torch >= 2.1
# needs it), and the wheel is cached in ~/.cache/paraflow/wheels (PARAFLOW_WHEEL_CACHE), keyed by
# the horovod, torch and Python versions, so a later install takes seconds.
#
# Usage: scripts/build_horovod.sh PYTHON [--force]
set -euo pipefail

PY="${1:?usage: build_horovod.sh PYTHON [--force]}"
shift
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" -m paraflow.cli build-horovod --python "$PY" "$@"
