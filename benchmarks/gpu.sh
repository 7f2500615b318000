#!/usr/bin/env bash
# A short GPU benchmark (under 5 minutes) for a machine with NVIDIA GPUs and a CUDA build of torch:
# single, dp, ddp-nccl and horovod (when built with NCCL) at 1 process and one per GPU, every
# model (2 launches per cell) and the allreduce sweep up to 256 MB. The CPU transports are left
# to `make bench`.
#
# Usage: benchmarks/gpu.sh [OUT] [extra paraflow-bench options]   (default OUT: bench-results-gpu)
# Python: $PYTHON, else .venv/bin/python, else python3.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-bench-results-gpu}"
shift || true
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi

read -r GPUS BACKENDS < <("$PY" - <<'PYEOF'
import sys, torch
if not torch.cuda.is_available():
    sys.exit(f"no GPU visible to torch {torch.__version__} (a CPU build, or no driver): "
             "install a CUDA build of torch, or run `make bench` for the CPU benchmark")
backends = ["dp", "ddp-nccl"]
try:
    import horovod.torch as hvd
    if hvd.nccl_built():
        backends.append("horovod")
except Exception:  # not installed, or built for another torch
    pass
print(torch.cuda.device_count(), ",".join(backends))
PYEOF
)
[ -n "${GPUS:-}" ] || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
# One process per GPU at most (NCCL refuses two ranks on one GPU); with one GPU there is no
# allreduce to sweep.
NPROCS="1"
if [ "$GPUS" -gt 1 ]; then NPROCS="1,$GPUS"; fi
echo "GPUs: $GPUS; backends: single,$BACKENDS; process counts: $NPROCS; results: $OUT/"

# Wider models than the CPU defaults so the GPU has work; each launch may take 90 s at most.
exec timeout --signal=INT 290 "$PY" benchmarks/run.py --out "$OUT" --backend "$BACKENDS" --nprocs "$NPROCS" \
    --model mlp:width=4096 --model cnn:width=64 --model transformer:width=256,depth=4 \
    --batch-size 256 --max-bytes 256M --min-window 0.5 --repeat 2 --launch-timeout 90 "$@"
