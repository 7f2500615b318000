"""The quick start in plain PyTorch DDP: `torchrun --nproc_per_node 2 plain_pytorch.py`."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

torch.manual_seed(0)
features = torch.randn(1024, 20)
labels = (features[:, :10].sum(dim=1) > 0).long()
dataset = TensorDataset(features, labels)

dist.init_process_group("gloo")
try:
    sampler = DistributedSampler(dataset, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = torch.nn.CrossEntropyLoss()
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        mean_loss /= dist.get_world_size()
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: loss {mean_loss.item():.3f} on {dist.get_world_size()} process(es)")
finally:
    dist.destroy_process_group()
