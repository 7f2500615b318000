"""What a lost worker costs: Horovod Elastic's in-process rollback against torchrun's restart.

Usage: python benchmarks/elastic_recovery.py [LAUNCHES] [COMMIT_EVERY] [horovod|ddp-gloo ...]

Each launch trains a small model on two processes under paraflow.elastic (horovod under
horovodrun's elastic mode; ddp-gloo under torchrun --max-restarts 1), SIGKILLs rank 1 after 35
steps, and measures, from the step log the workers write:
- recovery: seconds from the kill to the first optimizer step after the recovery;
- steps lost: steps trained again (those since the last commit; torchrun's commits are
  checkpoints written every COMMIT_EVERY steps, Horovod's are copies in memory).
Each figure is the median over launches with its 95% interval across launches (Student's t on
the log scale, paraflow.bench.report.intervals), as the benchmark's other figures.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KILL_AT_STEP, STEPS = 35, 120


def worker(log_path: str, commit_every: int) -> None:
    """One rank: train, committing every `commit_every` steps, logging ``time step life rank`` per step."""
    import torch

    import paraflow
    from paraflow.elastic import State, run

    with paraflow.init() as backend:
        torch.manual_seed(0)
        model = backend.wrap_model(
            torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
        )
        optimizer = backend.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.01), model)
        state = State(model, optimizer, backend=backend, step=0)
        log = open(f"{log_path}.{os.getpid()}", "a", buffering=1)

        @run
        def train(state):
            x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
            while state.step < STEPS:
                torch.nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
                optimizer.zero_grad()
                state.step += 1
                log.write(f"{time.time()} {state.step} {state.recoveries} {backend.rank}\n")
                if state.step % commit_every == 0:
                    state.commit()

        train(state)


def launch(kind: str, directory: Path, commit_every: int) -> tuple[float, int, str]:
    """One launch of `kind` ("horovod" or "ddp-gloo"): (seconds to recover, steps lost, rank 0's
    start-up line: what ran)."""
    log = directory / "steps"
    me = [sys.executable, __file__, "--worker", str(log), str(commit_every)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PARAFLOW_NUM_THREADS": "1"}
    if kind == "horovod":
        discover = directory / "discover.sh"
        discover.write_text("#!/bin/sh\necho localhost:1\necho 127.0.0.1:1\n")
        discover.chmod(0o755)
        command = ["horovodrun", "-np", "2", "--min-np", "1", "--max-np", "2", "--host-discovery-script", str(discover)]
        command, env["PARAFLOW_BACKEND"] = [*command, *me], "horovod"
    else:
        from paraflow.environment.launchers import free_port

        elastic = ["--nnodes", "1:1", "--nproc_per_node", "2", "--max-restarts", "1", "--rdzv-backend", "c10d"]
        endpoint = ["--rdzv-endpoint", f"127.0.0.1:{free_port('127.0.0.1')}"]
        command = [sys.executable, "-m", "torch.distributed.run", *elastic, *endpoint, *me[1:]]
        env["PARAFLOW_BACKEND"] = "ddp-gloo"
        env["PARAFLOW_ELASTIC_CHECKPOINT"] = str(directory / "state.pt")
    out = open(directory / "output", "w")
    proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    killed_at = None
    try:
        while proc.poll() is None and killed_at is None:
            for path in directory.glob("steps.*"):
                rows = [line.split() for line in path.read_text().splitlines()]
                if rows and rows[-1][3] == "1" and int(rows[-1][1]) >= KILL_AT_STEP:
                    os.kill(int(path.name.split(".")[1]), signal.SIGKILL)
                    killed_at = time.time()
                    break
            time.sleep(0.01)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    rows = [line.split() for p in directory.glob("steps.*") for line in p.read_text().splitlines()]
    if proc.returncode != 0 or killed_at is None:
        tail = (directory / "output").read_text()[-3000:]
        raise RuntimeError(
            f"{kind}: the launch ended with {proc.returncode} (killed: {killed_at is not None}):\n{tail}"
        )
    before = max(int(step) for t, step, life, rank in rows if life == "0" and float(t) <= killed_at)
    after = [(float(t), int(step)) for t, step, life, rank in rows if life != "0"]
    first_time, first_step = min(after)
    output = (directory / "output").read_text().splitlines()
    banner = next((line for line in output if re.search(r"paraflow: [\w.-]+ over ", line)), "")
    return first_time - killed_at, before - (first_step - 1), banner


def main() -> None:
    from paraflow.bench.report.intervals import estimate

    launches = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    commit_every = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    print(f"{'recovery':<34}{'seconds to the next step':>28}{'steps lost':>24}")
    kinds = sys.argv[3:] or ["horovod", "ddp-gloo"]
    for kind, what in (
        ("horovod", "horovodrun: rollback in process"),
        ("ddp-gloo", "torchrun: restart from checkpoint"),
    ):
        if kind not in kinds:
            continue
        results = []
        for _ in range(launches):
            with tempfile.TemporaryDirectory(prefix="pf-elastic-bench-") as directory:
                results.append(launch(kind, Path(directory), commit_every))
        print(results[0][2], file=sys.stderr)  # what ran: backend, launcher, threads
        seconds = estimate([[s] for s, _, _ in results], "mean", "elastic", kind, "seconds")
        lost = [n for _, n, _ in results]
        print(
            f"{what:<34}{seconds.value:>10.2f} [{seconds.low:.2f}, {seconds.high:.2f}]"
            f"{'':>6}{sum(lost) / len(lost):>10.1f} (of {min(lost)}-{max(lost)})"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2], int(sys.argv[3]))
    else:
        main()
