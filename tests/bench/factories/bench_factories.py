"""Model factories for `paraflow bench --model bench_factories:FUNCTION` in the tests (no torchvision)."""

import torch
from torch import nn


def pair(hidden="16"):
    """(model, (inputs, targets)): a small MLP with its own batch of 8, integer targets."""
    hidden = int(hidden)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, hidden), nn.ReLU(), nn.Linear(hidden, 3))
    generator = torch.Generator().manual_seed(1)
    return model, (torch.randn(8, 12, generator=generator), torch.randint(0, 3, (8,), generator=generator))


def regression():
    """(model, (inputs, targets)) with float targets: mean squared error."""
    return nn.Linear(5, 2), (torch.randn(6, 5), torch.randn(6, 2))


def bare(width="4"):
    """A bare module: the benchmark makes its batch from --input-shape and --classes."""
    width = int(width)
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 5)
    )


def broken():
    raise RuntimeError("no weights here")


def wrong_type():
    return "a string"


def gpt2(layers="2"):
    """A 2-layer GPT-2 from a config: no weights, no hub (needs transformers)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=int(layers), n_head=2, n_embd=32, vocab_size=97, n_positions=16)
    tokens = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(0))
    return GPT2LMHeadModel(config), ({"input_ids": tokens}, tokens)
