"""Horovod's PyTorch ImageNet ResNet-50 example, in its idiom, on synthetic images and a small
ResNet defined here: learning-rate warm-up, gradient accumulation (--batches-per-allreduce),
checkpoints on rank 0 with the resume epoch broadcast, metrics averaged with allreduce.

mpirun -np 2 python docs/examples/horovod_imagenet_resnet.py                                   (Horovod)
paraflow run -n 2 --backend ddp-gloo --horovod-api docs/examples/horovod_imagenet_resnet.py    (DDP)
Rank 0 ends by printing the sum of the weights, to compare runs.
"""

import argparse
import math
import os

import horovod.torch as hvd
import torch
import torch.nn.functional as F
import torch.utils.data.distributed
from torch import nn, optim

parser = argparse.ArgumentParser(description="PyTorch ImageNet Example (synthetic data, small ResNet)")
parser.add_argument("--checkpoint-format", default="./checkpoint-{epoch}.pth.tar", help="checkpoint file format")
parser.add_argument("--fp16-allreduce", action="store_true", default=False, help="use fp16 compression")
parser.add_argument("--batches-per-allreduce", type=int, default=2, help="batches processed locally per allreduce")
parser.add_argument("--use-adasum", action="store_true", default=False, help="use adasum algorithm for reduction")
parser.add_argument("--gradient-predivide-factor", type=float, default=1.0, help="apply gradient predivide factor")
parser.add_argument("--batch-size", type=int, default=8, help="input batch size for training")
parser.add_argument("--val-batch-size", type=int, default=16, help="input batch size for validation")
parser.add_argument("--epochs", type=int, default=2, help="number of epochs to train")
parser.add_argument("--base-lr", type=float, default=0.0125, help="learning rate for a single GPU")
parser.add_argument("--warmup-epochs", type=float, default=1, help="number of warmup epochs")
parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
parser.add_argument("--wd", type=float, default=0.00005, help="weight decay")
parser.add_argument("--images", type=int, default=256, help="synthetic training images")
parser.add_argument("--seed", type=int, default=42, help="random seed")


class BasicBlock(nn.Module):
    def __init__(self, inputs, outputs, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.shortcut = nn.Sequential()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class SmallResNet(nn.Module):
    """ResNet's shape (a stem, stages of residual blocks, global pooling) at a size a CPU trains in seconds."""

    def __init__(self, classes=10, widths=(16, 32, 64)):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        stages, inputs = [], widths[0]
        for i, width in enumerate(widths):
            stages.append(BasicBlock(inputs, width, 1 if i == 0 else 2))
            inputs = width
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(inputs, classes)

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def synthetic_images(count, seed):
    """Random 3x32x32 images labelled by a fixed random teacher: the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(count, 3, 32, 32, generator=g)
    labels = (images.mean(dim=1).flatten(1) @ torch.randn(32 * 32, 10, generator=g)).argmax(1)
    return torch.utils.data.TensorDataset(images, labels)


def train(epoch):
    model.train()
    train_sampler.set_epoch(epoch)
    train_loss, train_accuracy = Metric("train_loss"), Metric("train_accuracy")
    for batch_idx, (data, target) in enumerate(train_loader):
        adjust_learning_rate(epoch, batch_idx)
        optimizer.zero_grad()
        # Split data into sub-batches of size batch_size
        for i in range(0, len(data), args.batch_size):
            data_batch = data[i : i + args.batch_size]
            target_batch = target[i : i + args.batch_size]
            output = model(data_batch)
            train_accuracy.update(accuracy(output, target_batch))
            loss = F.cross_entropy(output, target_batch)
            train_loss.update(loss)
            # Average gradients among sub-batches
            loss.div_(math.ceil(float(len(data)) / args.batch_size))
            loss.backward()
        # Gradient is applied across all ranks
        optimizer.step()
    if verbose:
        loss, acc = train_loss.avg.item(), 100.0 * train_accuracy.avg.item()
        print(f"Train Epoch #{epoch + 1}: loss {loss:.4f}, accuracy {acc:.2f}%")


def validate(epoch):
    model.eval()
    val_loss, val_accuracy = Metric("val_loss"), Metric("val_accuracy")
    with torch.no_grad():
        for data, target in val_loader:
            output = model(data)
            val_loss.update(F.cross_entropy(output, target))
            val_accuracy.update(accuracy(output, target))
    if verbose:
        loss, acc = val_loss.avg.item(), 100.0 * val_accuracy.avg.item()
        print(f"Validate Epoch #{epoch + 1}: loss {loss:.4f}, accuracy {acc:.2f}%")


# Horovod: using `lr = base_lr * hvd.size()` from the very beginning leads to worse final
# accuracy. Scale the learning rate `lr = base_lr` ---> `lr = base_lr * hvd.size()` during
# the first five epochs. See https://arxiv.org/abs/1706.02677 for details.
# After the warmup reduce learning rate by 10 on the 30th, 60th and 80th epochs.
def adjust_learning_rate(epoch, batch_idx):
    if epoch < args.warmup_epochs:
        epoch += float(batch_idx + 1) / len(train_loader)
        lr_adj = 1.0 / hvd.size() * (epoch * (hvd.size() - 1) / args.warmup_epochs + 1)
    elif epoch < 30:
        lr_adj = 1.0
    elif epoch < 60:
        lr_adj = 1e-1
    elif epoch < 80:
        lr_adj = 1e-2
    else:
        lr_adj = 1e-3
    for param_group in optimizer.param_groups:
        param_group["lr"] = args.base_lr * hvd.size() * args.batches_per_allreduce * lr_adj


def accuracy(output, target):
    pred = output.max(1, keepdim=True)[1]
    return pred.eq(target.view_as(pred)).float().mean()


def save_checkpoint(epoch):
    if hvd.rank() == 0:
        filepath = args.checkpoint_format.format(epoch=epoch + 1)
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        torch.save(state, filepath)


# Horovod: average metrics from distributed training.
class Metric:
    def __init__(self, name):
        self.name = name
        self.sum = torch.tensor(0.0)
        self.n = torch.tensor(0.0)

    def update(self, val):
        self.sum += hvd.allreduce(val.detach().cpu(), name=self.name)
        self.n += 1

    @property
    def avg(self):
        return self.sum / self.n


if __name__ == "__main__":
    args = parser.parse_args()
    allreduce_batch_size = args.batch_size * args.batches_per_allreduce
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    # If set > 0, will resume training from a given checkpoint.
    resume_from_epoch = 0
    for try_epoch in range(args.epochs, 0, -1):
        if os.path.exists(args.checkpoint_format.format(epoch=try_epoch)):
            resume_from_epoch = try_epoch
            break
    # Horovod: broadcast resume_from_epoch from rank 0 (which will have checkpoints) to other ranks.
    resume_from_epoch = hvd.broadcast(torch.tensor(resume_from_epoch), root_rank=0, name="resume_from_epoch").item()
    verbose = 1 if hvd.rank() == 0 else 0

    train_dataset = synthetic_images(args.images, args.seed)
    val_dataset = synthetic_images(args.images // 4, args.seed + 1)
    # Horovod: use DistributedSampler to partition data among workers.
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank()
    )
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=allreduce_batch_size, sampler=train_sampler)
    val_sampler = torch.utils.data.distributed.DistributedSampler(val_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    val_loader = torch.utils.data.DataLoader(val_dataset, batch_size=args.val_batch_size, sampler=val_sampler)

    model = SmallResNet()
    # By default, Adasum doesn't need scaling up learning rate.
    # For sum/average with gradient Accumulation: scale learning rate by batches_per_allreduce
    lr_scaler = args.batches_per_allreduce * hvd.size() if not args.use_adasum else 1
    # Horovod: scale learning rate by the number of GPUs.
    optimizer = optim.SGD(
        model.parameters(), lr=(args.base_lr * lr_scaler), momentum=args.momentum, weight_decay=args.wd
    )
    # Horovod: (optional) compression algorithm.
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    # Horovod: wrap optimizer with DistributedOptimizer.
    optimizer = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=compression,
        backward_passes_per_step=args.batches_per_allreduce,
        op=hvd.Adasum if args.use_adasum else hvd.Average,
        gradient_predivide_factor=args.gradient_predivide_factor,
    )

    # Restore from a previous checkpoint, if initial_epoch is specified.
    # Horovod: restore on the first worker which will broadcast weights to other workers.
    if resume_from_epoch > 0 and hvd.rank() == 0:
        checkpoint = torch.load(args.checkpoint_format.format(epoch=resume_from_epoch))
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])

    # Horovod: broadcast parameters & optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    for epoch in range(resume_from_epoch, args.epochs):
        train(epoch)
        validate(epoch)
        save_checkpoint(epoch)
    if verbose:
        print(f"weights sum {sum(p.double().sum().item() for p in model.parameters()):.12f}")
