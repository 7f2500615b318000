"""Small models for examples and benchmarks, all taking (N, 1, H, W) images."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..errors import ConfigurationError

__all__ = ["MODELS", "build_model", "count_parameters"]


class MLP(nn.Module):
    """Flatten, then `depth` hidden layers of `width` units with ReLU."""

    def __init__(self, in_shape: tuple[int, ...], classes: int, width: int = 128, depth: int = 2):
        super().__init__()
        features = int(torch.tensor(in_shape).prod())
        layers: list[nn.Module] = [nn.Flatten()]
        for _ in range(depth):
            layers += [nn.Linear(features, width), nn.ReLU()]
            features = width
        layers.append(nn.Linear(features, classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ConvNet(nn.Module):
    """Two 3x3 convolutions with batch norm, global average pooling, a linear head."""

    def __init__(self, in_shape: tuple[int, ...], classes: int, width: int = 32):
        super().__init__()
        channels = in_shape[0]
        self.features = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class TinyTransformer(nn.Module):
    """Each image row is a token: linear embedding, pre-norm encoder layers, mean pooling."""

    def __init__(self, in_shape: tuple[int, ...], classes: int, width: int = 64, depth: int = 2, heads: int = 4):
        super().__init__()
        channels, rows, cols = in_shape
        self.embed = nn.Linear(channels * cols, width)
        self.position = nn.Parameter(torch.zeros(1, rows, width))
        layer = nn.TransformerEncoderLayer(
            width, heads, dim_feedforward=4 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.permute(0, 2, 1, 3).flatten(2)  # (N, rows, channels * cols)
        hidden = self.encoder(self.embed(tokens) + self.position)
        return self.head(hidden.mean(dim=1))


MODELS: dict[str, Callable[..., nn.Module]] = {"mlp": MLP, "cnn": ConvNet, "transformer": TinyTransformer}


def build_model(name: str, in_shape: tuple[int, ...] = (1, 8, 8), classes: int = 10, **kwargs) -> nn.Module:
    """Build model `name` (mlp, cnn, transformer) for images of `in_shape`."""
    if name not in MODELS:
        raise ConfigurationError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}.")
    return MODELS[name](tuple(in_shape), classes, **kwargs)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable scalars in `model`."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
