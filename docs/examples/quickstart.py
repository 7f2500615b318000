"""Train a small classifier: `python quickstart.py` or `paraflow run -n 2 --backend ddp-gloo quickstart.py`."""

import torch
from torch.utils.data import DataLoader, TensorDataset

import paraflow

torch.manual_seed(0)
features = torch.randn(1024, 20)
labels = (features[:, :10].sum(dim=1) > 0).long()
dataset = TensorDataset(features, labels)

with paraflow.init() as backend:  # the backend from `paraflow run --backend`, PARAFLOW_BACKEND or the launcher
    sampler = backend.distributed_sampler(dataset, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    model = backend.wrap_model(model)
    optimizer = backend.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    loss_fn = torch.nn.CrossEntropyLoss()
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(backend.device), y.to(backend.device)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
        mean_loss = backend.allreduce(loss.detach(), op="mean")
        if backend.is_main:
            print(f"epoch {epoch}: loss {mean_loss.item():.3f} on {backend.world_size} process(es)")
