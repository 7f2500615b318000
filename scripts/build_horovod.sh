#!/usr/bin/env bash
# Build (once) and install Horovod with PyTorch, MPI and gloo support into the given Python.
#
# Horovod 0.28.1 asks CMake for C++14, but torch >= 2.1 headers need C++17. A small cmake
# wrapper injects a project-include file that maps CMake's C++14 flag to -std=c++17.
# The wheel is cached outside the checkout, keyed by horovod, torch and Python versions.
#
# Usage: scripts/build_horovod.sh PYTHON
set -euo pipefail

PY="${1:?usage: build_horovod.sh PYTHON}"
HVD_VERSION="${HOROVOD_VERSION:-0.28.1}"
CACHE="${PARAFLOW_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/paraflow/wheels}"

if "$PY" -c "import horovod.torch" 2>/dev/null; then
    echo "horovod already installed: $("$PY" -c 'import horovod; print(horovod.__version__)')"
    exit 0
fi

TORCH_VERSION="$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')"
PY_TAG="$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
KEY="horovod-${HVD_VERSION}-torch${TORCH_VERSION}-${PY_TAG}"
WHEEL_DIR="$CACHE/$KEY"

if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
    command -v mpicc >/dev/null || {
        echo "error: mpicc not found; install Open MPI first: apt-get install openmpi-bin libopenmpi-dev" >&2
        exit 1
    }
    CMAKE_BIN="$(command -v cmake || true)"
    [ -n "$CMAKE_BIN" ] || { echo "error: cmake not found; install it: apt-get install cmake" >&2; exit 1; }
    WORK="$(mktemp -d)"
    trap 'rm -rf "$WORK"' EXIT
    cat > "$WORK/cxx17.cmake" <<'CMAKE'
set(CMAKE_CXX14_STANDARD_COMPILE_OPTION "-std=c++17")
set(CMAKE_CXX14_EXTENSION_COMPILE_OPTION "-std=gnu++17")
CMAKE
    cat > "$WORK/cmake" <<WRAP
#!/usr/bin/env bash
if [ "\${1:-}" = "--build" ] || [ "\${1:-}" = "--version" ]; then exec "$CMAKE_BIN" "\$@"; fi
exec "$CMAKE_BIN" -DCMAKE_PROJECT_INCLUDE="$WORK/cxx17.cmake" "\$@"
WRAP
    chmod +x "$WORK/cmake"
    "$PY" -m pip install -q setuptools wheel packaging psutil pyyaml cloudpickle cffi
    echo "building $KEY (several minutes; cached in $WHEEL_DIR afterwards)"
    mkdir -p "$WHEEL_DIR"
    HOROVOD_CMAKE="$WORK/cmake" CMAKE_POLICY_VERSION_MINIMUM=3.5 \
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
    HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_GPU_OPERATIONS= \
    MAKEFLAGS="-j$(nproc)" \
        "$PY" -m pip wheel --no-build-isolation --no-deps -w "$WHEEL_DIR" "horovod==${HVD_VERSION}"
fi
"$PY" -m pip install -q "$WHEEL_DIR"/horovod-*.whl
"$PY" -c "import horovod.torch as hvd; print('horovod', hvd.__version__ if hasattr(hvd,'__version__') else '', 'mpi', hvd.mpi_built(), 'gloo', hvd.gloo_built())"
