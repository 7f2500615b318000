"""Run train.py with a training set that records the index of every sample this rank trains.

Usage: <launcher> python tests/workers/resume_trace.py OUT_DIR TRAIN_ARGS...
Writes OUT_DIR/rank<R>.json: the indices, in the order this rank fetched them. train.py's
loader uses no worker processes, so a fetched sample is a trained one.
"""

import json
import os
import sys
from pathlib import Path

from torch.utils.data import Dataset

import train


class Recording(Dataset):
    """`dataset`, noting each index fetched."""

    def __init__(self, dataset, seen):
        self.dataset, self.seen = dataset, seen

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        self.seen.append(int(index))
        return self.dataset[index]


def main(out: str, argv: list) -> None:
    seen = []
    load = train.load_dataset

    def recording_load(*args, **kwargs):
        train_set, test_set = load(*args, **kwargs)
        return Recording(train_set, seen), test_set

    train.load_dataset = recording_load
    train.main(argv)
    rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
