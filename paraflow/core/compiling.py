"""``torch.compile`` in ``wrap_model``: the ``compile=`` option, and models compiled before wrapping.

``compile=True`` (or a dict of :func:`torch.compile` keyword arguments) asks the backend to
compile in the order it wants (docs/compile.md); a model the script compiled itself
(``torch.compile(model)``, an ``OptimizedModule``) is taken apart here where a backend must reach
the module inside.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import torch
from torch import nn

from ..errors import ConfigurationError

__all__ = [
    "COMPILE_KEYS",
    "CompileOption",
    "compile_options",
    "compile_model",
    "compiled_parts",
    "uncompiled",
    "refuse_skipped_inner_module",
    "refuse_eager_under_compile",
    "skipped_by_compiler",
    "skipped_message",
    "compile_forwards",
    "compiler_of",
]

#: The keyword arguments of torch.compile that ``compile={...}`` passes through.
COMPILE_KEYS = frozenset({"mode", "dynamic", "backend", "fullgraph", "options", "disable"})

CompileOption = Union[None, bool, dict]


def compile_options(compile: CompileOption) -> Optional[dict]:
    """The keyword arguments for torch.compile that `compile` asks for, or None for no compiling.

    Raises:
        ConfigurationError: `compile` is not None, a bool or a dict of torch.compile's arguments.
    """
    if compile is None or compile is False:
        return None
    if compile is True:
        return {}
    if isinstance(compile, dict):
        unknown = sorted(set(compile) - COMPILE_KEYS)
        if unknown:
            raise ConfigurationError(
                f"wrap_model(compile=...) got {unknown}, which torch.compile does not take here; "
                f"use any of {sorted(COMPILE_KEYS)}, e.g. compile={{'mode': 'max-autotune'}}."
            )
        return dict(compile)
    raise ConfigurationError(
        f"wrap_model(compile={compile!r}): pass True, False, or a dict of torch.compile's arguments "
        f"such as {{'mode': 'reduce-overhead', 'dynamic': False}}."
    )


def compiled_parts(model: nn.Module) -> tuple[nn.Module, Optional[nn.Module]]:
    """(the module inside, the ``torch.compile`` wrapper or None) of `model`."""
    if isinstance(model, torch._dynamo.eval_frame.OptimizedModule):
        return model._orig_mod, model
    return model, None


def uncompiled(model: nn.Module) -> nn.Module:
    """`model` without ``torch.compile``'s wrapper (its own state_dict keys, no ``_orig_mod.``)."""
    return compiled_parts(model)[0]


def compile_model(model: nn.Module, options: Optional[dict]) -> nn.Module:
    """``torch.compile(model, **options)``, or `model` when `options` is None.

    Raises:
        ConfigurationError: `model` is compiled already and `options` asks to compile it again.
    """
    if options is None:
        return model
    if compiled_parts(model)[1] is not None:
        raise ConfigurationError(
            "wrap_model(model, compile=...) was given a model torch.compile already wrapped; compiling "
            "it twice would nest the compiler in itself. Pass the module itself with compile=True, or "
            "the compiled one without compile=."
        )
    return torch.compile(model, **options)


@torch.compiler.disable
def refuse_skipped_inner_module(module: nn.Module, wrapper: str = "ddp") -> None:
    """Raise if torch.compile, tracing `wrapper`'s code around `module`, would run it eagerly.

    torch's compiler does not compile a frame inside torch itself (``nn.Sequential``'s forward,
    ``nn.Linear``'s) that it reaches as a new frame, as it does under DDP's forward and after
    FSDP2's hooks; the model would train, uncompiled, without a word. Runs eagerly, from inside
    the traced forward.

    Raises:
        ConfigurationError: the module's forward is one torch's compiler skips.
    """
    forward_compiled = "forward" in vars(module)  # compile_forwards did it
    if compiled_parts(module)[1] is None and not forward_compiled and skipped_by_compiler(module):
        raise ConfigurationError(skipped_message(module, wrapper))


def skipped_by_compiler(module: nn.Module) -> bool:
    """Whether torch's compiler skips the frame of `module`'s forward (its trace rules; False if
    they cannot say)."""
    try:
        from torch._dynamo import trace_rules

        return bool(trace_rules.check(type(module).forward))
    except Exception:  # a private API: when it moves, assume torch compiles the frame
        return False


def compile_forwards(modules: list, compiler: Callable[[Callable], Callable]) -> None:
    """Compile, in place, the forward of each of `modules` that torch's compiler would skip.

    Under FSDP2 each sharded module's hooks break the graph, and the compiler then meets the
    module's forward as a frame of its own: one of torch's own (``nn.TransformerEncoderLayer``)
    would run eagerly. Its forward compiled by itself, the hooks stay outside the graphs.
    """
    for module in modules:
        if skipped_by_compiler(module) and "forward" not in vars(module):
            module.forward = compiler(module.forward)


def compiler_of(compiled: nn.Module) -> Callable[[Callable], Callable]:
    """What compiles a function as torch.compile compiled `compiled` (an OptimizedModule): its options.

    Raises:
        ConfigurationError: this torch keeps no such record.
    """
    context = getattr(compiled, "dynamo_ctx", None)
    if context is None:
        raise ConfigurationError(
            "this torch's compiled module does not say how it was compiled, so fsdp cannot compile its sharded "
            "blocks alike: pass the module itself with the options, backend.wrap_model(model, compile={...})."
        )
    return context


def skipped_message(module: nn.Module, wrapper: str) -> str:
    """Why torch.compile would leave `module` uncompiled under `wrapper`, and what to do instead."""
    name = type(module).__name__
    if wrapper == "fsdp-root":
        return (
            f"fsdp cannot compile this {name} whole: FSDP2's hooks on its sharded blocks break the graph, and "
            f"torch's compiler runs the rest of torch's own {name}.forward eagerly after each break. Hold the "
            f"{name} in a module of your own whose forward calls it (or its blocks), then compile."
        )
    if wrapper == "fsdp":
        return (
            f"torch.compile around the fsdp model would not compile this {name}: FSDP2's hooks break the graph, "
            f"and torch's compiler skips torch's own modules' forwards after them, so it would run eagerly. Let "
            f"paraflow compile it, which compiles each sharded module's forward: backend.wrap_model(model, "
            f"compile=True), or backend.wrap_model(torch.compile(model))."
        )
    return (
        f"torch.compile around the DDP model would not compile the {name} inside it: torch's compiler "
        f"skips torch's own modules reached under DDP's forward, so it would run eagerly. Compile the "
        f"module before wrapping it, backend.wrap_model(torch.compile(model)), or let paraflow choose "
        f"the order: backend.wrap_model(model, compile=True)."
    )


def refuse_eager_under_compile(module: nn.Module, *_: Any) -> None:
    """A forward pre-hook: under torch.compile, refuse `module` if its forward would run eagerly."""
    if torch.compiler.is_compiling():
        refuse_skipped_inner_module(module, "fsdp")
