"""Backend names mapped to classes and preset options; heavy modules are imported lazily."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from ..errors import ConfigurationError, UnknownBackendError

__all__ = ["register", "registered_names", "create", "BackendSpec", "available_backends", "unavailable_reason"]


@dataclass(frozen=True)
class BackendSpec:
    """A registered name: where its class lives and the options it presets."""

    name: str
    target: Union[str, type]  # a class, or "module:Class" imported on first use
    presets: dict = field(default_factory=dict)
    description: str = ""
    alias_of: str = ""  # another name that runs the same thing here (left out of default benchmarks)

    def load(self) -> type:
        """Import and return the backend class."""
        if not isinstance(self.target, str):
            return self.target
        module, _, cls = self.target.partition(":")
        try:
            return getattr(importlib.import_module(module), cls)
        except AttributeError:
            raise ConfigurationError(
                f"backend {self.name!r} is registered as {self.target!r}, but module {module!r} has no "
                f"{cls!r}; fix the register_backend call."
            ) from None


_REGISTRY: dict[str, BackendSpec] = {}


def register(name: str, target: Union[str, type], description: str = "", alias_of: str = "", **presets: Any) -> None:
    """Register `target` (a class or "module:Class") under `name` with preset keyword options."""
    _REGISTRY[name] = BackendSpec(name, target, presets, description, alias_of)


def registered_names() -> list[str]:
    """Every registered backend name, in registration order."""
    return list(_REGISTRY)


def spec(name: str) -> BackendSpec:
    """The registration of `name`; unknown names get the list of known ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownBackendError(
            f"unknown backend {name!r}; known backends: {', '.join(_REGISTRY)}. "
            "Pick one with --backend NAME or PARAFLOW_BACKEND=NAME."
        ) from None


def create(name: str, **options: Any):
    """Instantiate backend `name` (not yet initialised); `options` override its presets."""
    s = spec(name)
    return s.load()(name=name, **{**s.presets, **options})


def unavailable_reason(name: str) -> Optional[str]:
    """None when backend `name` can run here, else why not (what ``paraflow backends`` prints)."""
    s = spec(name)
    try:
        return s.load().unavailable_reason(**s.presets)
    except ImportError as exc:  # a backend module whose own imports fail
        return str(exc)


def available_backends() -> dict[str, Optional[str]]:
    """Map every registered name to None when it can run here, else the reason it cannot."""
    return {name: unavailable_reason(name) for name in _REGISTRY}
