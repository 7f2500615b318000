"""A nanoGPT-shaped model (its blocks in an nn.ModuleList) under fsdp with no option.

paraflow run -n 2 --backend fsdp docs/examples/porting_module_list.py
paraflow run -n 2 --backend ddp-gloo docs/examples/porting_module_list.py   # the same numbers
"""

import torch
import torch.nn.functional as F
from torch import nn

import paraflow

VOCAB, WIDTH, LAYERS, CONTEXT = 64, 64, 4, 16


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x):
        return x + self.mlp(self.ln(x))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.h = nn.ModuleList(Block() for _ in range(LAYERS))  # as nanoGPT's transformer.h
        self.ln_f = nn.LayerNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, VOCAB)

    def forward(self, idx):
        x = self.wte(idx)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


with paraflow.init() as backend:
    torch.manual_seed(0)
    model = backend.wrap_model(GPT())  # fsdp shards h.0 ... h.3, then the root
    if backend.is_main and hasattr(model, "paraflow_blocks"):
        print("sharded blocks:", ", ".join(model.paraflow_blocks))
    optimizer = backend.wrap_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3), model)
    g = torch.Generator().manual_seed(backend.rank)
    for _ in range(5):
        idx = torch.randint(0, VOCAB, (4, CONTEXT + 1), generator=g)
        logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), idx[:, 1:].reshape(-1))
        loss.backward()
        backend.clip_grad_norm_(model, 1.0)
        optimizer.step()
        optimizer.zero_grad()
    loss = backend.allreduce(loss.detach(), op="mean")
    if backend.is_main:
        print(f"last loss {loss.item():.10f}")
