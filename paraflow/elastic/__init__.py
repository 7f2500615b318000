"""Elastic training, written once: Horovod Elastic and torchrun's restarts behind one API.

```python
state = paraflow.elastic.State(model, optimizer, sampler=sampler, epoch=0, step=0)

@paraflow.elastic.run
def train(state):
    for state.epoch in range(state.epoch, epochs):
        state.sampler.set_epoch(state.epoch)
        for i, (x, y) in enumerate(loader):
            ...
            state.sampler.record_batch(i, batch_size)
            state.commit()

train(state)
```

Under horovodrun's elastic mode the survivors of a lost worker roll back to the last commit in
process (Horovod Elastic); under torchrun with ``--max-restarts`` commits are written as
paraflow checkpoints, which the restarted workers restore. The names are Horovod's
(``hvd.elastic.run``, ``TorchState``, ``ElasticSampler``). See docs/elastic.md.
"""

from __future__ import annotations

from .run import NotElasticError, recovery_mode, run
from .sampler import ElasticSampler
from .state import HostsUpdated, State, TorchState

__all__ = ["run", "State", "TorchState", "ElasticSampler", "HostsUpdated", "NotElasticError", "recovery_mode"]
