"""The sample accounting of tests/elastic/workers/accounting.py's logs: outside the steps rolled back
(at most one commit interval per recovery), every sample of each epoch is trained exactly once."""

from __future__ import annotations

import collections
from pathlib import Path

WORKER = Path(__file__).resolve().parent / "workers" / "accounting.py"
SAMPLES, COMMIT_EVERY = 96, 3  # as in the worker
EPOCHS = 4


def accounting(log_dir: Path) -> dict:
    """Per epoch, the ids trained outside rolled-back steps (a step's last life only), and the rolled-back steps."""
    lines = [line.split() for log in log_dir.glob("*.log") for line in log.read_text().splitlines()]
    last_life = collections.defaultdict(int)
    for _epoch, step, life, *_ in lines:
        last_life[int(step)] = max(last_life[int(step)], int(life))
    kept, rolled_back = collections.defaultdict(collections.Counter), set()
    for epoch, step, life, _world, _rank, ids in lines:
        if int(life) < last_life[int(step)]:
            rolled_back.add((int(step), int(life)))
            continue
        kept[int(epoch)].update(int(i) for i in ids.split(","))
    return {"kept": kept, "rolled_back": rolled_back}


def check_accounting(log_dir: Path, recoveries: int) -> None:
    result = accounting(log_dir)
    assert sorted(result["kept"]) == list(range(EPOCHS))
    for epoch, seen in result["kept"].items():
        assert max(seen.values()) == 1, f"epoch {epoch}: samples trained twice outside a rollback"
        missing = set(range(SAMPLES)) - set(seen)
        assert len(missing) <= 1, f"epoch {epoch}: samples never trained: {sorted(missing)}"
    assert len(result["rolled_back"]) <= COMMIT_EVERY * max(recoveries, 0), result["rolled_back"]
