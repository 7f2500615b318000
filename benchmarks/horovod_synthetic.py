"""Horovod's own way of measuring throughput, on raw horovod: the anchor `paraflow bench` agrees with.

The method of Horovod's examples/pytorch/pytorch_synthetic_benchmark.py, written again here so it
runs any model `paraflow bench --model` takes: one synthetic batch per rank, SGD wrapped in
hvd.DistributedOptimizer, parameters and optimizer state broadcast from rank 0; warm-up batches,
then `--num-iters` iterations of `--num-batches-per-iter` steps each, timed with timeit (no
device synchronisation beyond what the optimizer's step waits for). Each iteration gives
batch x batches / time img/s on rank 0; the result is rank 0's mean over iterations (± 1.96
standard deviations) and that mean times the world size as the total.

    cd benchmarks
    mpirun -np 2 python horovod_synthetic.py --model resnet_shaped:build:width=16 --input-shape 3,32,32 \\
        --classes 10 --batch-size 32 --threads 1
    paraflow bench --model resnet_shaped:build:width=16 --input-shape 3,32,32 --classes 10 \\
        --backend horovod --launcher mpirun -n 2 --batch-size 32 --threads 1    # the same, measured by paraflow

With --json, rank 0 also prints its figures as one JSON line.
"""

import argparse
import json
import statistics
import sys
import timeit
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # paraflow from a checkout; resnet_shaped from here

import horovod.torch as hvd  # noqa: E402
import torch  # noqa: E402

from paraflow.bench.model_spec import ModelSpec  # noqa: E402
from paraflow.bench.rank.factory import batch_samples, build_factory, call_model  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet_shaped:build", help="MODULE:FUNCTION[:key=value,...], as --model")
    p.add_argument("--input-shape", default="3,32,32", help="one sample's shape, for a factory's bare module")
    p.add_argument("--classes", type=int, default=10, help="classes of the synthetic targets")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    p.add_argument("--num-warmup-batches", type=int, default=10, help="untimed steps first")
    p.add_argument("--num-batches-per-iter", type=int, default=10, help="steps per timed iteration")
    p.add_argument("--num-iters", type=int, default=10, help="timed iterations")
    p.add_argument("--threads", type=int, default=None, help="torch threads per rank (default: torch's)")
    p.add_argument("--json", action="store_true", help="rank 0 also prints its figures as one JSON line")
    args = p.parse_args()

    hvd.init()
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(hvd.local_rank())
    device = torch.device("cuda" if cuda else "cpu")
    shape = tuple(int(s) for s in args.input_shape.split(",")) if args.input_shape else None
    built = build_factory(ModelSpec.parse(args.model), shape, args.classes, args.batch_size, device=device)
    model = built.module.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), op=hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    data, target = built.inputs, built.targets

    def benchmark_step() -> None:
        optimizer.zero_grad()
        built.loss(call_model(model, data), target).backward()  # cross-entropy for class targets
        optimizer.step()

    samples = batch_samples(built.inputs)
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    rates = []
    for i in range(args.num_iters):
        seconds = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        rates.append(samples * args.num_batches_per_iter / seconds)
        if hvd.rank() == 0:
            print(f"Iter #{i}: {rates[-1]:.1f} img/sec per {'GPU' if cuda else 'CPU'}", flush=True)
    mean, spread = statistics.fmean(rates), 1.96 * statistics.pstdev(rates)
    if hvd.rank() == 0:
        unit = "GPU" if cuda else "CPU"
        print(f"Img/sec per {unit}: {mean:.1f} +-{spread:.1f}")
        print(f"Total img/sec on {hvd.size()} {unit}(s): {hvd.size() * mean:.1f} +-{hvd.size() * spread:.1f}")
        if args.json:
            print(json.dumps({"per_rank": mean, "conf": spread, "total": hvd.size() * mean, "iters": rates}))
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
