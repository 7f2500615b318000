"""A Horovod script as Horovod's examples write it: `mpirun -np 2 python docs/examples/porting_horovod_before.py`.

Gradients are averaged inside optimizer.step(), so clipping needs optimizer.synchronize() first
and the step then runs under optimizer.skip_synchronize(); backward_passes_per_step accumulates.
"""

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from porting_common import batch, build_model  # the model and data, the same in every example

STEPS, MICRO = 8, 2


hvd.init()
torch.set_num_threads(1)
model = build_model()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
optimizer = hvd.DistributedOptimizer(
    optimizer, named_parameters=model.named_parameters(), backward_passes_per_step=MICRO
)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
# --8<-- [start:loop]
for step in range(STEPS):
    x, y = batch(step, hvd.rank(), hvd.size())
    for xs, ys in zip(x.chunk(MICRO), y.chunk(MICRO)):
        (F.cross_entropy(model(xs), ys) / MICRO).backward()
    optimizer.synchronize()  # finish the allreduce, so that clipping sees the average
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    with optimizer.skip_synchronize():  # do not allreduce again
        optimizer.step()
    optimizer.zero_grad()
# --8<-- [end:loop]
if hvd.rank() == 0:
    print(f"weights sum {sum(p.double().sum().item() for p in model.parameters()):.12f}")
hvd.shutdown()
