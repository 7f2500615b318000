"""Your own model in the benchmark: `--model MODULE:FUNCTION[:key=value,...]`.

The function is imported from the current directory or PYTHONPATH and called with the options as
string keyword arguments. It returns either

- an ``nn.Module``: the benchmark then makes a synthetic classification batch of ``--batch-size``
  samples of ``--input-shape`` with integer targets below ``--classes``; or
- a pair ``(model, (inputs, targets))``: one rank's example batch, repeated every step.

The loss is cross-entropy for integer targets (over the last dimension of the output, so a
language model's ``(batch, tokens, vocabulary)`` logits against ``(batch, tokens)`` targets work)
and mean squared error otherwise. Inputs may be a tensor, a tuple of tensors (positional
arguments) or a dict (keyword arguments); an output with ``.logits`` (Hugging Face) or a tuple
(its first element) is reduced to that tensor.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_map_only

from ...errors import ConfigurationError

__all__ = [
    "Built",
    "batch_samples",
    "build_factory",
    "check_factory",
    "load_factory",
    "model_facts",
    "to_device",
    "take",
    "call_model",
    "loss_function",
]


@dataclass
class Built:
    """A factory's model with the batch one rank steps on and the loss between them."""

    module: nn.Module
    inputs: Any
    targets: torch.Tensor
    loss: Callable


def batch_samples(inputs: Any) -> int:
    """The first dimension of the first tensor in `inputs` (a tensor, a sequence or a dict)."""
    if isinstance(inputs, torch.Tensor):
        return int(inputs.shape[0]) if inputs.dim() else 1
    values = inputs.values() if isinstance(inputs, dict) else inputs if isinstance(inputs, (list, tuple)) else ()
    for value in values:
        if isinstance(value, torch.Tensor):
            return batch_samples(value)
    return 0


def load_factory(spec) -> Callable:
    """The function named by `spec` (`module:function`), imported from the current directory or PYTHONPATH."""
    module_name, _, function = spec.name.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):  # the module itself, not one it imports
            raise ConfigurationError(
                f"--model {spec}: no module named {module_name!r} here ({os.getcwd()}) or on PYTHONPATH; run from the "
                f"folder that holds {module_name.replace('.', '/')}.py, or add its folder to PYTHONPATH."
            ) from None
        raise ConfigurationError(f"--model {spec}: importing {module_name} failed: {exc}") from exc
    except Exception as exc:
        raise ConfigurationError(f"--model {spec}: importing {module_name} raised {type(exc).__name__}: {exc}") from exc
    factory = getattr(module, function, None)
    if not callable(factory):
        names = [n for n in vars(module) if callable(getattr(module, n)) and not n.startswith("_")]
        raise ConfigurationError(
            f"--model {spec}: {module_name} has no function {function!r}; it has {', '.join(names[:12]) or 'none'}."
        )
    return factory


def _call(spec) -> Any:
    factory = load_factory(spec)
    try:
        return factory(**spec.kwargs)
    except Exception as exc:
        raise ConfigurationError(
            f"--model {spec}: {spec.name}({', '.join(f'{k}={v!r}' for k, v in spec.options)}) raised "
            f"{type(exc).__name__}: {exc} (options arrive as strings: convert them in the factory)."
        ) from exc


def _check_targets(spec, targets: Any) -> torch.Tensor:
    if not isinstance(targets, torch.Tensor):
        raise ConfigurationError(
            f"--model {spec}: the batch's targets are a {type(targets).__name__}, not a tensor; return "
            "(model, (inputs, targets)) with targets a tensor."
        )
    return targets


def build_factory(
    spec, input_shape: Optional[tuple], classes: int, batch_size: int, seed: int = 0, device=None
) -> Built:
    """Call the factory of `spec` and make its batch (see the module doc); clear errors for a
    factory that raises or returns something else."""
    torch.manual_seed(seed)
    made = _call(spec)
    if isinstance(made, nn.Module):
        if not input_shape:
            raise ConfigurationError(
                f"--model {spec} returns a bare nn.Module: give one sample's shape and the class count, e.g. "
                "--input-shape 3,224,224 --classes 1000, or return (model, (inputs, targets)) from the factory."
            )
        generator = torch.Generator().manual_seed(seed)
        inputs = torch.randn(batch_size, *input_shape, generator=generator)
        targets = torch.randint(0, int(classes), (batch_size,), generator=generator)
        module = made
    elif isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module):
        batch = made[1]
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
            raise ConfigurationError(
                f"--model {spec} returned (model, {type(batch).__name__}): the second element must be the pair "
                "(inputs, targets)."
            )
        module, (inputs, targets) = made[0], batch
        targets = _check_targets(spec, targets)
    else:
        what = type(made).__name__ if not isinstance(made, tuple) else f"a tuple of {len(made)}"
        raise ConfigurationError(
            f"--model {spec} returned {what}; a factory returns an nn.Module (with --input-shape and --classes) "
            "or (model, (inputs, targets))."
        )
    if device is not None:
        inputs, targets = to_device(inputs, device), targets.to(device)
    return Built(module, inputs, targets, loss_function(targets))


def check_factory(spec, input_shape: Optional[tuple], classes: int) -> dict:
    """Build `spec`'s model once and run a forward pass and its loss on a small batch, before any
    launch: a factory that raises, returns the wrong thing or does not fit --input-shape is a clear
    ConfigurationError here, not a failed launch per cell. Returns model_facts."""
    built = build_factory(spec, input_shape, classes, batch_size=2)
    try:
        with torch.no_grad():
            built.loss(call_model(built.module, built.inputs), built.targets)
    except Exception as exc:
        hint = "check --input-shape and --classes" if input_shape else "check the batch the factory returns"
        raise ConfigurationError(
            f"--model {spec}: a forward pass and its loss on the batch raised {type(exc).__name__}: {exc} ({hint})."
        ) from exc
    return model_facts(built.module)


def model_facts(module: nn.Module) -> dict:
    """`module`'s trainable parameter count, the bytes of all its parameters (trainable or not) and
    the bytes of the trainable ones' gradients."""
    params = list(module.parameters())
    trainable = [p for p in params if p.requires_grad]
    return {
        "parameters": sum(p.numel() for p in trainable),
        "param_bytes": sum(p.numel() * p.element_size() for p in params),
        "grad_bytes": sum(p.numel() * p.element_size() for p in trainable),
    }


def take(inputs: Any, targets: torch.Tensor, rank: int, world_size: int) -> tuple:
    """Rank `rank`'s equal share of a global batch (strong scaling), along the first dimension."""
    n = len(targets)
    if n % world_size:
        raise ConfigurationError(
            f"strong scaling splits the factory's batch of {n} over {world_size} ranks, but it does not divide; "
            "return a batch whose size does, or use weak scaling."
        )
    share = slice(rank * n // world_size, (rank + 1) * n // world_size)
    return tree_map_only(torch.Tensor, lambda t: t[share], inputs), targets[share]


def to_device(inputs: Any, device) -> Any:
    """`inputs` with every tensor in it on `device`."""
    if isinstance(inputs, torch.Tensor):  # the built-in models' batch, every timed step: no tree walk
        return inputs.to(device)
    return tree_map_only(torch.Tensor, lambda t: t.to(device), inputs)


def call_model(model: nn.Module, inputs: Any) -> torch.Tensor:
    """model(inputs), model(*inputs) or model(**inputs), reduced to its output tensor."""
    if isinstance(inputs, dict):
        out = model(**inputs)
    elif isinstance(inputs, (list, tuple)):
        out = model(*inputs)
    else:
        out = model(inputs)
    if hasattr(out, "logits"):
        out = out.logits
    elif isinstance(out, (list, tuple)):
        out = out[0]
    return out


def loss_function(targets: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Cross-entropy for integer targets (classes on the output's last dimension), else mean squared error."""
    if targets.dtype.is_floating_point or targets.dtype.is_complex:
        return lambda out, y: F.mse_loss(out, y)

    def cross_entropy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if out.dim() > 2:
            return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        return F.cross_entropy(out, y)

    return cross_entropy
