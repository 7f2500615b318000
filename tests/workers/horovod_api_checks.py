"""paraflow.compat.horovod on two ranks, beyond the idiom script: argv MODE OUT_DIR.

- checks: SyncBatchNorm over the ranks' halves of a batch against BatchNorm over the whole batch,
  and a DistributedOptimizer over a parameter no rank uses; writes OUT_DIR/rank<R>.json;
- raise: rank 1 fails after a first allreduce while rank 0 waits in a second one.
"""

import json
import sys
from pathlib import Path

import torch
from torch import nn

import paraflow.compat.horovod as hvd

mode, out = sys.argv[1], Path(sys.argv[2])
torch.set_num_threads(1)
hvd.init()
r = hvd.rank()

if mode == "raise":
    hvd.allreduce(torch.ones(2))
    if r == 1:
        raise RuntimeError("rank 1 fails on purpose")
    hvd.allreduce(torch.ones(2))
    sys.exit(0)

torch.manual_seed(0)
x = torch.randn(8, 3, 5, dtype=torch.float64)
upstream = torch.randn(8, 3, 5, dtype=torch.float64)
whole, plain = x.clone().requires_grad_(), nn.BatchNorm1d(3).double()
expected = plain(whole)
(expected * upstream).sum().backward()
mine = x[4 * r : 4 * r + 4].clone().requires_grad_()
sync = hvd.SyncBatchNorm(3).double()
out_sync = sync(mine)
(out_sync * upstream[4 * r : 4 * r + 4]).sum().backward()
weight_grad = hvd.allreduce(sync.weight.grad, op=hvd.Sum)


def gap(a, b):
    return (a.detach() - b.detach()).abs().max().item()


class Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.used, self.unused = nn.Linear(2, 2), nn.Linear(2, 2)

    def forward(self, x):
        return self.used(x)


model = Unused()
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
model(torch.ones(1, 2) * (r + 1)).sum().backward()
optimizer.step()
report = {
    "output": gap(out_sync, expected[4 * r : 4 * r + 4]),
    "input_grad": gap(mine.grad, whole.grad[4 * r : 4 * r + 4]),
    "weight_grad": gap(weight_grad, plain.weight.grad),
    "running_mean": gap(sync.running_mean, plain.running_mean),
    "running_var": gap(sync.running_var, plain.running_var),
    "unused_grad": model.unused.weight.grad.abs().max().item(),
    "used_grad": model.used.weight.grad.tolist(),
}
(out / f"rank{r}.json").write_text(json.dumps(report))
