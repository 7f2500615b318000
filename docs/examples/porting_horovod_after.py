"""porting_horovod_before.py on paraflow: the Horovod loop unchanged, under any backend.

PARAFLOW_BACKEND=horovod mpirun -np 2 -x PARAFLOW_BACKEND python docs/examples/porting_horovod_after.py
paraflow run -n 2 --backend ddp-gloo docs/examples/porting_horovod_after.py
paraflow run -n 2 --backend fsdp docs/examples/porting_horovod_after.py
"""

import torch
import torch.nn.functional as F
from porting_common import batch, build_model  # the model and data, the same in every example

import paraflow

STEPS, MICRO = 8, 2


# the backend PARAFLOW_BACKEND names (`paraflow run --backend` sets it), else ddp under any launcher
with paraflow.init(accumulation_steps=MICRO) as backend:  # was backward_passes_per_step=MICRO
    model = backend.wrap_model(build_model())  # broadcasts rank 0's parameters
    optimizer = backend.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model)
    # --8<-- [start:loop]
    for step in range(STEPS):
        x, y = batch(step, backend.rank, backend.world_size)
        for xs, ys in zip(x.chunk(MICRO), y.chunk(MICRO)):
            with backend.accumulate(model):
                (F.cross_entropy(model(xs), ys) / MICRO).backward()
        optimizer.synchronize()  # kept: horovod finishes its allreduce; elsewhere nothing to do
        backend.clip_grad_norm_(model, 0.5)  # was torch.nn.utils.clip_grad_norm_
        with optimizer.skip_synchronize():  # kept: a no-op where backward reduced
            optimizer.step()
        optimizer.zero_grad()
    # --8<-- [end:loop]
    weights = backend.unwrap(model).state_dict()
    weights = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in weights.items()}  # fsdp's shards
    if backend.is_main:
        print(f"weights sum {sum(v.double().sum().item() for v in weights.values()):.12f}")
