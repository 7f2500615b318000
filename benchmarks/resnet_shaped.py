"""A ResNet-18-shaped model for CPU benchmarks, no torchvision: `--model resnet_shaped:build`.

ResNet-18's layout (a 3x3 stem, four stages of two basic blocks each, the last three halving the
resolution and doubling the channels, global average pooling, one linear layer) at a width a CPU
steps in milliseconds: `width` channels in the first stage (ResNet-18 has 64), for small images
(CIFAR's 3x32x32, so no 7x7 stride-2 stem and no max-pool).

    cd benchmarks
    paraflow bench --model resnet_shaped:build:width=16 --input-shape 3,32,32 --classes 10 \\
        --backend horovod --launcher mpirun -n 2
"""

from torch import nn


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and a shortcut (a 1x1 convolution where the shape changes)."""

    def __init__(self, channels_in: int, channels: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels_in, channels, 3, stride, 1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(inplace=True),
            nn.Conv2d(channels, channels, 3, 1, 1, bias=False),
            nn.BatchNorm2d(channels),
        )
        self.shortcut = nn.Identity()
        if stride != 1 or channels_in != channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(channels_in, channels, 1, stride, bias=False), nn.BatchNorm2d(channels)
            )
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(self.body(x) + self.shortcut(x))


def build(width: str = "16", classes: str = "10", blocks: str = "2,2,2,2") -> nn.Module:
    """ResNet-18's layout (`blocks` per stage) with `width` channels in the first stage."""
    width, classes = int(width), int(classes)
    layers = [nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
    channels = width
    for stage, count in enumerate(int(b) for b in blocks.split(",")):
        out = width * 2**stage
        for i in range(count):
            layers.append(BasicBlock(channels, out, 2 if stage and i == 0 else 1))
            channels = out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes)]
    return nn.Sequential(*layers)
