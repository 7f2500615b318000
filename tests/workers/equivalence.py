"""Train a float64 model for a few steps on a fixed global batch split evenly over ranks.

Usage: <launcher> python tests/workers/equivalence.py BACKEND OUT [ACCUMULATION [MODE [OPTIONS]]]
Rank r takes rows [r*B/n, (r+1)*B/n) of every global batch; with ACCUMULATION k > 1 each rank's
share is further split into k micro-batches whose losses are scaled by 1/k. MODE "no_sync"
(default) runs the first k-1 backward passes under backend.no_sync; "option" passes
accumulation_steps=k to the backend instead; "accumulate" passes it and runs every micro-batch
under backend.accumulate(model). OPTIONS, "key=value,...", go to paraflow.init
(for example "compression=fp16"). Rank 0 writes the final parameters to OUT.
"""

import sys

import torch
import torch.nn.functional as F

import paraflow
from paraflow.examples.models import build_model

STEPS, GLOBAL_BATCH, SEED = 5, 16, 1234


def main(name: str, out: str, accumulation: int = 1, mode: str = "no_sync", extra: str = "") -> None:
    torch.set_default_dtype(torch.float64)
    options = {"accumulation_steps": accumulation} if mode in ("option", "accumulate") else {}
    options.update(item.split("=", 1) for item in extra.split(",") if item)
    with paraflow.init(name, **options) as backend:
        torch.manual_seed(SEED)
        model = backend.wrap_model(build_model("mlp", width=16))
        optimizer = backend.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model)
        messages = _count_gradient_messages(model, optimizer, name) if mode == "accumulate" else [0]
        g = torch.Generator().manual_seed(SEED)
        n, r = backend.world_size, backend.rank
        share = GLOBAL_BATCH // n
        for _ in range(STEPS):
            x = torch.randn(GLOBAL_BATCH, 1, 8, 8, generator=g)
            y = torch.randint(0, 10, (GLOBAL_BATCH,), generator=g)
            x, y = x[r * share : (r + 1) * share], y[r * share : (r + 1) * share]
            optimizer.zero_grad()
            micro = share // accumulation
            for k in range(accumulation):
                xs, ys = x[k * micro : (k + 1) * micro], y[k * micro : (k + 1) * micro]
                last = k == accumulation - 1 or mode == "option"
                if mode == "accumulate":
                    sent_before = messages[0]
                    with backend.accumulate(model) as sync:
                        (F.cross_entropy(model(xs), ys) / accumulation).backward()
                    assert sync == (k == accumulation - 1), f"accumulate() said sync={sync} at micro-batch {k}"
                    sent = messages[0] - sent_before
                    assert (sent > 0) == (sync and n > 1), (
                        f"micro-batch {k} (sync={sync}) sent {sent} gradient messages"
                    )
                    continue
                with backend.no_sync(model) if not last else _nothing():
                    loss = F.cross_entropy(model(xs), ys) / accumulation
                    loss.backward()
            optimizer.step()
        state = backend.unwrap(model).state_dict()
        state = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in state.items()}  # fsdp's shards
        if backend.is_main:
            torch.save({k: v.cpu() for k, v in state.items()}, out)


def _count_gradient_messages(model, optimizer, backend_name) -> list:
    """A one-item counter of gradient messages started (DDP buckets, horovod tensors, FSDP reduce-scatters)."""
    counter = [0]
    if hasattr(optimizer, "_allreduce_grad_async"):  # horovod's DistributedOptimizer
        start = optimizer._allreduce_grad_async

        def counting(p):
            counter[0] += 1
            return start(p)

        optimizer._allreduce_grad_async = counting
    elif hasattr(model, "register_comm_hook"):  # DDP: its plain averaging allreduce, counted
        import torch.distributed as dist

        from paraflow.backends.ddp.comm_hooks import tracked_then

        def hook(state, bucket):
            counter[0] += 1
            buffer = bucket.buffer().div_(dist.get_world_size())
            return tracked_then(dist.all_reduce(buffer, async_op=True).get_future(), lambda fut: fut.value()[0])

        model.register_comm_hook(None, hook)
    elif backend_name == "fsdp":  # FSDP2's gradient reduce-scatters
        import torch.distributed as dist

        reduce_scatter = dist.reduce_scatter_single

        def counting_reduce_scatter(*args, **kwargs):
            counter[0] += 1
            return reduce_scatter(*args, **kwargs)

        dist.reduce_scatter_single = counting_reduce_scatter
    return counter


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main(
        sys.argv[1],
        sys.argv[2],
        int(sys.argv[3]) if len(sys.argv) > 3 else 1,
        sys.argv[4] if len(sys.argv) > 4 else "no_sync",
        sys.argv[5] if len(sys.argv) > 5 else "",
    )
