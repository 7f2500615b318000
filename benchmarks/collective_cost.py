"""Public collectives against the library's own calls, and a training step with the stall watch on and off.

Usage: torchrun --nproc_per_node 2 benchmarks/collective_cost.py [BACKEND] [ROUNDS]   (default ddp-gloo 15)
       mpirun -np 2 python benchmarks/collective_cost.py horovod [ROUNDS]         (horovod's MPI controller)
       horovodrun -np 2 --gloo python benchmarks/collective_cost.py horovod [ROUNDS]

For 4 KB, 1 MB, 16 MB and 64 MB of float32, rank 0 prints the median over ROUNDS of
``backend.allreduce_(x)`` against the library's in-place sum (``dist.all_reduce(x)``,
``hvd.allreduce_(x)``) and ``backend.allreduce(x)`` against the library's sum of a copy, the two
sides interleaved call by call in this one process, the order flipped every round, and the
library's in-place sum against itself: the A/A control, how far two identical sides differ.
Then the same small training step through a model wrapped with the stall watch's markers and one
wrapped without them (the watch's thread runs throughout; it wakes every threshold / 4 s),
interleaved the same way, once for each order of building the two models, beside an A/A control
of two models without markers.
"""

import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import paraflow
from paraflow.bench.backends import raw_loop

SIZES = {"4 KB": 1024, "1 MB": 262_144, "16 MB": 4_194_304, "64 MB": 16_777_216}  # float32 elements


def timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def interleaved(backend, ours, theirs, calls: int, rounds: int) -> tuple:
    """Medians of `ours`' and `theirs`' seconds per call and of the per-round ratio; each round
    times `calls` of one, then of the other, the order flipped every round."""
    mine, raw = [], []
    for r in range(rounds):
        for call, times in ((ours, mine), (theirs, raw))[:: 1 if r % 2 else -1]:
            backend.barrier()
            times.append(timed(lambda call=call: [call() for _ in range(calls)]) / calls)
    return statistics.median(mine), statistics.median(raw), statistics.median(m / r for m, r in zip(mine, raw))


def collectives(backend, rounds: int) -> None:
    raw = raw_loop(backend.name)  # the benchmark's sweep calls the library through the same object
    in_place = raw.allreduce_ if raw is not None else dist.all_reduce
    for label, n in SIZES.items():
        x = torch.ones(n)
        calls = max(1, 25_000 // n)
        pairs = {
            "allreduce_ / all_reduce in place": (
                lambda x=x: backend.allreduce_(x, "sum"),
                lambda x=x: in_place(x),
            ),
            "allreduce / all_reduce of a copy": (
                lambda x=x: backend.allreduce(x, "sum"),
                lambda x=x: in_place(x.clone()),
            ),
            "A/A: all_reduce / all_reduce in place": (lambda x=x: in_place(x), lambda x=x: in_place(x)),
        }
        for name, (ours, theirs) in pairs.items():
            interleaved(backend, ours, theirs, calls, 2)  # warm-up
            mine, raw, ratio = interleaved(backend, ours, theirs, calls, rounds)
            if backend.is_main:
                print(
                    f"{label:>6} {name:38s} {mine * 1e6:9.1f} us / {raw * 1e6:9.1f} us  median ratio {ratio:.3f}",
                    flush=True,
                )


def training_step(backend, rounds: int) -> None:
    """The step with markers against the step without, each order of building the two models once
    (on two cores the model built first can be the slower one, markers or not), and the same for
    two models without markers: the A/A control of how far two identical models differ."""

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))

    activity = backend._activity
    x, y = torch.randn(32, 64), torch.randint(0, 8, (32,))

    def steps(marked: tuple) -> list:
        """One training step for each of two models built in order, `marked[i]` saying whether the
        i-th gets the stall watch's markers."""
        runs = []
        for on in marked:
            backend._activity = activity if on else None  # a model and optimizer without markers
            net = backend.wrap_model(model())
            optimizer = backend.wrap_optimizer(torch.optim.SGD(net.parameters(), lr=0.01), net)

            def run(net=net, optimizer=optimizer, on=on):
                backend._activity = activity if on else None  # horovod's step reads it at each call
                optimizer.zero_grad()
                F.cross_entropy(net(x), y).backward()
                optimizer.step()
                backend._activity = activity

            runs.append(run)
        backend._activity = activity
        return runs

    ratios = {}
    for label, marked in (("on built first", (True, False)), ("off built first", (False, True))):
        on, off = steps(marked)[:: 1 if marked[0] else -1]
        interleaved(backend, on, off, 20, 2)
        mine, raw, ratios[label] = interleaved(backend, on, off, 20, rounds)
        if backend.is_main:
            print(
                f"training step  stall watch on {mine * 1e3:.3f} ms  off {raw * 1e3:.3f} ms  "
                f"median ratio {ratios[label]:.3f} ({label})",
                flush=True,
            )
    first, second = steps((False, False))
    interleaved(backend, first, second, 20, 2)
    control = interleaved(backend, first, second, 20, rounds)[2]
    if backend.is_main:
        both = statistics.geometric_mean(ratios.values())
        print(
            f"training step  on / off over both orders {both:.3f}; "
            f"A/A control (two models without markers) {control:.3f}",
            flush=True,
        )


def main(name: str, rounds: int) -> None:
    with paraflow.init(name) as backend:
        collectives(backend, rounds)
        training_step(backend, rounds)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "ddp-gloo", int(sys.argv[2]) if len(sys.argv) > 2 else 15)
