"""The abstraction overhead's pairs, fitted to what the run's time budget leaves.

The overhead rides in the last planned launch of its cells (matrix.py), so when it starts the
run knows how long every launch still to come took in the earlier rounds. Its pairs get
``--overhead-seconds`` each, or, when the machine runs slow, an even share of what
``--time-budget`` leaves once those launches and each overhead's setup are counted; never less
than the worker's floor of MIN_PAIRS pairs (rank/overhead.py).
"""

from __future__ import annotations

from .config import BenchConfig
from .extra_launches import launch_cost

__all__ = ["overhead_seconds", "SETUP_S"]

#: An overhead measurement's seconds besides its pairs, about: building its nine models, the
#: warm-up rounds and the profiled steps (0.8-4.1 s here, 1.8 s on average over the six).
SETUP_S = 2.0


def overhead_seconds(config: BenchConfig, elapsed: float, left: list, done: list) -> float:
    """Seconds of pairs for the overhead of ``left[0]``.

    `elapsed`: seconds of the run so far; `left`: the cells still to launch, that one first;
    `done`: the launches so far (runner.CellResult), whose mean time per group projects the
    launches left (those that carried an overhead are not counted).
    """
    records = [result.to_dict() for result in done]
    projected = sum(launch_cost(records, c.group) for c in left)
    measures = max(1, sum(c.overhead is not None for c in left))
    spare = config.time_budget - elapsed - projected - measures * SETUP_S
    return max(0.0, min(config.overhead_seconds, spare / measures))
