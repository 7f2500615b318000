"""A training script in Horovod's idiom, as its users write them; `import horovod.torch as hvd` is the
only line that names the library (the tests change it, or leave it to `paraflow run --horovod-api`).

mpirun -np 2 python tests/workers/horovod_idiom.py OUT_DIR
Writes OUT_DIR/params.pt (rank 0's trained parameters and buffers) and OUT_DIR/rankR.json.
"""

import json
import sys
from pathlib import Path

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

out = Path(sys.argv[1])
torch.set_default_dtype(torch.float64)
torch.set_num_threads(1)

hvd.init()
torch.manual_seed(0)  # the same data on every rank
data = TensorDataset(torch.randn(64, 6), torch.randint(0, 3, (64,)))
sampler = DistributedSampler(data, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True, seed=1)
loader = DataLoader(data, batch_size=4, sampler=sampler)
torch.manual_seed(100 + hvd.rank())  # different weights on every rank: broadcast_parameters makes them rank 0's
model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * hvd.size(), momentum=0.9, weight_decay=1e-2)
optimizer = hvd.DistributedOptimizer(
    optimizer, named_parameters=model.named_parameters(), backward_passes_per_step=2, op=hvd.Average
)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

norms, losses = [], []
for epoch in range(2):
    sampler.set_epoch(epoch)
    for i, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y) / 2
        loss.backward()
        if i % 2 == 1:
            optimizer.synchronize()
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5).item())
            with optimizer.skip_synchronize():
                optimizer.step()
            optimizer.zero_grad()
    losses.append(hvd.allreduce(loss.detach() * 2, name="avg_loss").item())  # the metric, averaged over ranks
hvd.broadcast_parameters(dict(model.named_buffers()), root_rank=0)  # BatchNorm's running statistics: rank 0's

r = hvd.rank()
report = {
    "rank": r,
    "size": hvd.size(),
    "local": [hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()],
    "norms": norms,
    "losses": losses,
    "gathered": hvd.allgather(torch.full((r + 1, 2), float(r))).tolist(),
    "broadcast": hvd.broadcast(torch.tensor([r + 5.0]), root_rank=1).tolist(),
    "object": hvd.broadcast_object({"epoch": 2, "from": r}, root_rank=0),
    "objects": hvd.allgather_object(("rank", r)),
    "sum": hvd.allreduce(torch.tensor([r + 1.0, 2.0]), op=hvd.Sum).tolist(),
    "int_average": hvd.allreduce(torch.tensor([3 + r, 4 + r])).tolist(),
    "max": hvd.allreduce(torch.tensor([float(r), -float(r)]), op=hvd.Max).tolist(),
    "scaled": hvd.allreduce(torch.tensor([1.0, 3.0]) * (r + 1), prescale_factor=0.5, postscale_factor=3.0).tolist(),
    "grouped": [t.tolist() for t in hvd.grouped_allreduce([torch.ones(2) * r, torch.ones(3) * (r + 1)])],
    "alltoall": hvd.alltoall(torch.arange(4) + 10 * r).tolist(),
    "alltoall_splits": [t.tolist() for t in hvd.alltoall(torch.arange(3) + 10 * r, splits=[1, 2])],
    "reducescatter": hvd.reducescatter(torch.arange(5.0) * (r + 1)).tolist(),
}
leaf = torch.tensor([r + 1.0, 2.0 * (r + 1)], requires_grad=True)
(hvd.allgather(leaf.view(1, 2)) * torch.arange(1.0, 5.0).view(2, 2)).sum().backward()
root_leaf = torch.tensor([3.0 + r], requires_grad=True)
(hvd.broadcast(root_leaf, root_rank=0) * (r + 2)).sum().backward()
rows = torch.arange(4.0, requires_grad=True)
(hvd.alltoall(rows * (r + 1)) * torch.arange(1.0, 5.0)).sum().backward()
scattered = torch.arange(3.0, requires_grad=True)
(hvd.reducescatter(scattered, op=hvd.Sum) * (r + 1)).sum().backward()
report["gradients"] = [leaf.grad.tolist(), root_leaf.grad.tolist(), rows.grad.tolist(), scattered.grad.tolist()]
in_place = torch.tensor([1.0 + r])
handle = hvd.allreduce_async_(in_place, op=hvd.Sum)
report["async"] = [hvd.synchronize(handle).tolist(), in_place.tolist()]
hvd.barrier()
report["join"] = hvd.join()
(out / f"rank{r}.json").write_text(json.dumps(report))
if r == 0:
    torch.save(model.state_dict(), out / "params.pt")
