"""Benchmark every data-parallel backend available here; the same as `paraflow bench`.

    python benchmarks/run.py                                  # defaults: < 5 min on 2 cores
    python benchmarks/run.py --nprocs 1,2,4 --model mlp:width=2048,cnn:width=64
    python benchmarks/run.py --data digits --backend ddp-gloo,horovod --out my-results

Results (terminal tables; results.md, *.csv, results.json with raw per-rank numbers, PNG plots)
go to bench-results/ unless --out says otherwise. `--help` lists every option.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from paraflow.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
