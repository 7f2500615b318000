"""Train a small model under any paraflow backend; the loop is the same for every one.

Launch commands (N processes):
    python train.py --backend single                        # baseline: no wrapper
    python train.py --backend dp                            # nn.DataParallel, all visible GPUs
    torchrun --nproc_per_node N train.py --backend ddp      # NCCL with GPUs, else gloo
    mpirun -np N python train.py --backend ddp-gloo         # DDP under MPI (needs mpi4py)
    mpirun -np N python train.py --backend horovod          # Horovod, MPI controller
    horovodrun -np N -H localhost:N --gloo python train.py --backend horovod
    srun -n N python train.py --backend ddp                 # SLURM
    torchrun --nproc_per_node N train.py --backend fsdp --drop-last   # sharded (FSDP2)
As root, mpirun needs --allow-run-as-root; more ranks than cores needs --oversubscribe.

Training features, the same on every backend:
    --accumulation-steps 4          # step the optimizer every 4 batches (gradients sync once)
    --precision bf16                # autocast (fp16 adds loss scaling; bf16 is the CPU choice)
    --compression fp16              # 16-bit gradients on the wire (DDP hooks, horovod compression)
    --drop-last / --join on         # equal shards, or ranks with fewer batches join early
    --checkpoint ckpt.pt --save-every 100 --resume ckpt.pt
    --export full.pt                # fsdp: one unsharded file that ddp, horovod, single resume from

Elastic (paraflow.elastic, docs/elastic.md): a lost worker costs the steps since the last commit:
    horovodrun -np 2 --min-np 1 --max-np 2 --host-discovery-script S python train.py --backend horovod --elastic
    torchrun --nnodes 1:2 --nproc_per_node 2 --max-restarts 2 --rdzv-backend c10d \
        --rdzv-endpoint 127.0.0.1:29400 train.py --backend ddp-gloo --elastic
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import DataLoader, Subset

import paraflow
from paraflow.core.options import COMPRESSIONS
from paraflow.errors import ConfigurationError
from paraflow.examples.data import DATASETS, load_dataset
from paraflow.examples.models import MODELS, build_model
from paraflow.examples.record import RunRecord
from paraflow.tools.flags import renamed
from paraflow.training.precision import PRECISIONS


def build_parser() -> argparse.ArgumentParser:
    """train.py's command line (its flags follow the names `paraflow` uses for the same ideas)."""
    p = argparse.ArgumentParser(
        prog="train.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--backend",
        choices=paraflow.registered_names(),
        default=None,
        help="default: PARAFLOW_BACKEND, else ddp under a launcher, else single",
    )
    p.add_argument("--model", choices=list(MODELS), default="mlp", help="the model to train (default: mlp)")
    p.add_argument("--data", choices=DATASETS, default="digits", help="the data set (default: digits)")
    p.add_argument("--epochs", type=int, default=15, help="passes over the data (default 15)")
    p.add_argument(
        "--max-steps", type=int, default=0, metavar="N", help="stop after N optimizer steps in all (0: no limit)"
    )
    renamed(p, "--steps", use="--max-steps")
    p.add_argument("--batch-size", type=int, default=32, help="per process")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model, the data order and the synthetic data")
    p.add_argument("--json-out", default=None, help="rank 0 writes a result summary here")
    p.add_argument(
        "--accumulation-steps",
        type=int,
        default=1,
        help="batches per optimizer step; gradients cross ranks once per step",
    )
    p.add_argument("--precision", choices=PRECISIONS, default="fp32", help="autocast dtype (fp16: with loss scaling)")
    p.add_argument("--compression", choices=COMPRESSIONS, default="none", help="gradient dtype on the wire")
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the model, in the order the backend wants (docs/compile.md)",
    )
    p.add_argument(
        "--drop-last",
        action="store_true",
        help="leave out the len(data) %% ranks remainder each epoch so every rank gets equal shards",
    )
    p.add_argument(
        "--join",
        choices=("auto", "on", "off"),
        default="auto",
        help="let ranks with fewer batches finish early (auto: when shards give unequal batch counts)",
    )
    p.add_argument("--checkpoint", default=None, help="save here (atomically) at the end and every --save-every steps")
    p.add_argument("--save-every", type=int, default=0, help="optimizer steps between checkpoints (0: end only)")
    p.add_argument("--resume", default=None, help="continue from this checkpoint (written under any backend)")
    p.add_argument(
        "--elastic",
        action="store_true",
        help="survive lost and added workers (horovodrun --min-np/--max-np, torchrun --max-restarts); docs/elastic.md",
    )
    p.add_argument(
        "--commit-every", type=int, default=10, metavar="N", help="--elastic: optimizer steps between commits"
    )
    p.add_argument(
        "--export",
        default=None,
        help="at the end, also write a full checkpoint any backend resumes from (fsdp: unsharded)",
    )
    return p


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def evaluate(backend: paraflow.Backend, model: torch.nn.Module, dataset) -> float:
    """Held-out accuracy: each rank scores every world_size-th sample, counts are summed."""
    shard = Subset(dataset, range(backend.rank, len(dataset), backend.world_size))
    correct = total = 0
    model.eval()
    with torch.no_grad():
        for x, y in DataLoader(shard, batch_size=256):
            with backend.autocast():
                pred = model(x.to(backend.device)).argmax(dim=1).cpu()
            correct += int((pred == y).sum())
            total += len(y)
    model.train()
    counts = backend.allreduce(torch.tensor([correct, total], dtype=torch.int64), op="sum")
    return counts[0].item() / counts[1].item()


def end_epoch(backend, model, test_set, loss_sum: torch.Tensor, batches: int, line: str, tail: str) -> tuple:
    """(mean loss over ranks, held-out accuracy) of an epoch; rank 0 prints them between `line` and `tail`."""
    epoch_loss = backend.allreduce(loss_sum / max(batches, 1), op="mean").item()
    accuracy = evaluate(backend, model, test_set)
    if backend.is_main:
        print(f"{line}  loss {epoch_loss:.4f}  held-out accuracy {accuracy:.2%}  {tail}", flush=True)
    return epoch_loss, accuracy


def check_progress(progress: dict) -> dict:
    """The saved progress in samples; a position counted per rank (older checkpoints) only at an epoch boundary.

    A per-rank batch count resumes exactly only under the world size that wrote it, which those
    checkpoints do not record, so part-way through an epoch it is refused rather than guessed.
    """
    if "batch" not in progress:
        return progress
    if progress["batch"]:
        raise ConfigurationError(
            f"this checkpoint stopped part-way through epoch {progress['epoch']} at batch {progress['batch']} per "
            "rank, counted by an older train.py without the number of ranks, so it cannot be resumed exactly. "
            "Resume from a checkpoint written at an epoch boundary, or with the train.py and the number of ranks "
            "that wrote it."
        )
    return {"epoch": progress["epoch"], "sample": 0, "step": progress["step"]}


def train_elastic(args: argparse.Namespace, backend: paraflow.Backend, model, optimizer, scaler, data) -> dict:
    """The same training under paraflow.elastic: it goes on after a worker is lost or hosts change.

    Every sample of an epoch is trained once, except those of the steps since the last commit
    when a worker is lost (trained again); equal shards (drop_last) keep the ranks in step.
    """
    if args.accumulation_steps != 1 or args.join == "on" or args.max_steps:
        raise ConfigurationError("--elastic trains without --accumulation-steps, --join on and --max-steps.")
    if args.commit_every < 1:
        raise ConfigurationError(f"--commit-every must be 1 or more steps, got {args.commit_every}.")
    train_set, test_set = data
    sampler = paraflow.elastic.ElasticSampler(train_set, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    state = paraflow.elastic.State(
        model, optimizer, backend=backend, checkpoint=args.checkpoint, scaler=scaler, sampler=sampler, epoch=0, step=0
    )
    if args.resume:
        backend.load(args.resume, state.entries())
    record = RunRecord(backend, model=args.model, data=args.data, batch_size=args.batch_size, elastic=True)

    @paraflow.elastic.run
    def train(state: paraflow.elastic.State) -> dict:
        epoch_loss = accuracy = float("nan")
        for epoch in range(state.epoch, args.epochs):
            state.epoch = epoch
            sampler.set_epoch(epoch)
            loss_sum, batches = torch.zeros((), dtype=torch.float64), 0
            for batch, (x, y) in enumerate(loader):
                with record.batch():
                    with backend.autocast():
                        loss = F.cross_entropy(model(x.to(backend.device)), y.to(backend.device))
                    scaler.scale(loss).backward()
                    scaler.step(optimizer)
                    scaler.update()
                    optimizer.zero_grad(set_to_none=True)
                loss_sum += loss.detach().cpu().double()
                batches += 1
                state.step += 1
                sampler.record_batch(batch, args.batch_size)
                if state.step % args.commit_every == 0:
                    state.commit()
            state.epoch = epoch + 1
            state.commit()
            line, tail = f"epoch {epoch + 1}/{args.epochs}", f"{backend.world_size} processes  {record.elapsed():.1f}s"
            epoch_loss, accuracy = end_epoch(backend, model, test_set, loss_sum, batches, line, tail)
        return record.finish(
            model,
            json_out=args.json_out,
            steps=state.step,
            epochs_run=state.epoch,
            final_loss=epoch_loss,
            accuracy=accuracy,
            recoveries=state.recoveries,
        )

    result = train(state)
    if args.export:
        backend.export(args.export, state.entries())
    return result


@record  # under torchrun, a failing rank's traceback becomes the job's reported root cause
def main(argv=None) -> dict:
    args = parse_args(argv)
    options = {
        "precision": args.precision,
        "compression": args.compression,
        "accumulation_steps": args.accumulation_steps,
    }
    with paraflow.init(args.backend, **options) as backend:
        torch.manual_seed(args.seed)
        train_set, test_set = load_dataset(args.data, seed=args.seed)
        # compile= only when asked: a backend registered from outside may predate it
        model = backend.wrap_model(build_model(args.model), **({"compile": True} if args.compile else {}))
        optimizer = backend.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9), model)
        scaler = backend.grad_scaler()
        if args.elastic:
            return train_elastic(args, backend, model, optimizer, scaler, (train_set, test_set))
        sampler = backend.distributed_sampler(train_set, shuffle=True, seed=args.seed, drop_last=args.drop_last)
        # Its own generator, so iterating the loader leaves the global RNG (checkpointed) alone.
        loader = DataLoader(
            train_set, batch_size=args.batch_size, sampler=sampler, generator=torch.Generator().manual_seed(args.seed)
        )
        # Where the next batch starts, in samples of the epoch over all ranks (so a run may resume
        # under another number of ranks); a checkpoint holds it with everything training changes.
        progress = {"epoch": 0, "sample": 0, "step": 0}
        state = {"model": model, "optimizer": optimizer, "scaler": scaler, "sampler": sampler, "progress": progress}
        if args.resume:
            backend.load(args.resume, state)
            progress = state["progress"] = check_progress(state["progress"])
        shards = [sampler.shard_sizes()]  # whole epochs, then the rest of the one resumed
        sampler.set_epoch(progress["epoch"], position=progress["sample"])
        shards.append(sampler.shard_sizes())
        uneven = any(len({math.ceil(n / args.batch_size) for n in sizes}) > 1 for sizes in shards)
        join = args.join == "on" or (args.join == "auto" and uneven)

        record = RunRecord(
            backend, model=args.model, data=args.data, batch_size=args.batch_size, resumed_from=args.resume
        )
        step, epoch, saved_at, compute_dtype = progress["step"], progress["epoch"], None, None
        epoch_loss = accuracy = float("nan")
        for epoch in range(progress["epoch"], args.epochs):
            if args.max_steps and step >= args.max_steps:
                break
            sampler.set_epoch(epoch, position=progress["sample"] if epoch == progress["epoch"] else 0)
            batches_in_epoch = len(loader)
            loss_sum = torch.zeros((), dtype=torch.float64)
            batches, save_due = 0, False
            with backend.join(model, optimizer, scaler, enable=join):
                for batch, (x, y) in enumerate(loader):
                    with record.batch():
                        x, y = x.to(backend.device), y.to(backend.device)
                        with backend.accumulate(model) as sync:
                            with backend.autocast():
                                logits = model(x)
                                loss = F.cross_entropy(logits, y)
                            scaler.scale(loss / backend.accumulation_steps).backward()
                        if sync:
                            scaler.step(optimizer)
                            scaler.update()
                            optimizer.zero_grad(set_to_none=True)
                            step += 1
                            last = batch + 1 == batches_in_epoch
                            sample = 0 if last else sampler.position_after((batch + 1) * args.batch_size)
                            progress.update(epoch=epoch + last, sample=sample, step=step)
                            if args.checkpoint and args.save_every and step % args.save_every == 0:
                                save_due = True
                    compute_dtype = str(logits.dtype).replace("torch.", "")
                    loss_sum += loss.detach().cpu().double()
                    batches += 1
                    if save_due and not join:  # under join, ranks may have left: save after it
                        backend.save(args.checkpoint, state)
                        save_due, saved_at = False, step
                    if args.max_steps and step >= args.max_steps:
                        break
            if save_due:
                backend.save(args.checkpoint, state)
                saved_at = step
            line, tail = f"epoch {epoch + 1}/{args.epochs}", f"{record.elapsed():.1f}s"
            epoch_loss, accuracy = end_epoch(backend, model, test_set, loss_sum, batches, line, tail)
            if args.max_steps and step >= args.max_steps:
                break
        if args.checkpoint and saved_at != step:
            backend.save(args.checkpoint, state)
        if args.export:
            backend.export(args.export, state)
        return record.finish(
            model,
            json_out=args.json_out,
            steps=step,
            epochs_run=epoch + 1,
            final_loss=epoch_loss,
            accuracy=accuracy,
            joined=join,
            compute_dtype=compute_dtype,
        )


if __name__ == "__main__":
    main()
