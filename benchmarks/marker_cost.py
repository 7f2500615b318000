"""What the stall report's in-process record costs per training step and per paraflow call.

Usage: python benchmarks/marker_cost.py [REPEATS]
One process, no communication. Times, in microseconds, the fastest of 15 rounds (on a shared
host other processes only ever add time, so the fastest round is the least disturbed):
- the markers one training step runs (before and after the forward, after optimizer.step);
- what torch adds to a forward for having hooks at all (a module with two no-op hooks);
- the marker around one paraflow call (allreduce, save, ...).
A whole training step with and without markers is not compared here: on the 2-core machine the
difference drowned in noise of hundreds of microseconds.
"""

import sys
import time

import torch

from paraflow.reliability.activity import Activity, _ForwardMarker, _StepMarker


def fastest_us(call, repeats: int, rounds: int = 15) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            call()
        best = min(best, (time.perf_counter() - start) / repeats * 1e6)
    return best


def main(repeats: int) -> None:
    torch.set_num_threads(1)
    activity = Activity()
    model = torch.nn.Linear(4, 4)
    before, after, stepped = _ForwardMarker(activity, True), _ForwardMarker(activity, False), _StepMarker(activity)

    def step_markers() -> None:
        before(model, ())
        after(model, (), None)
        stepped(None, (), {})

    hooked = torch.nn.Linear(4, 4)
    hooked.register_forward_pre_hook(lambda *_: None)
    hooked.register_forward_hook(lambda *_: None)
    x = torch.randn(2, 4)

    def call_marker() -> None:
        with activity.call("allreduce"):
            pass

    markers = fastest_us(step_markers, repeats)
    dispatch = fastest_us(lambda: hooked(x), repeats) - fastest_us(lambda: model(x), repeats)
    call = fastest_us(call_marker, repeats)
    print(
        f"per training step: markers {markers:.2f} us + torch's hook dispatch {dispatch:.2f} us; "
        f"per paraflow call: {call:.2f} us",
        flush=True,
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20000)
