"""Start ddp-gloo in this one process, train a few steps, shut down and drop the model, ROUNDS times.

Freeing the model after shutdown frees the gloo process group; that must not wait forever for a
gloo thread still finishing the last backward's allreduce. Prints "done ROUNDS" at the end.
"""

import gc
import sys

import torch

import paraflow

rounds = int(sys.argv[1])
for _ in range(rounds):
    backend = paraflow.init("ddp-gloo")
    model = backend.wrap_model(torch.nn.Linear(64, 64))
    for _ in range(3):
        model(torch.randn(8, 64)).sum().backward()
    backend.shutdown()
    del model
    gc.collect()
print(f"done {rounds}")
