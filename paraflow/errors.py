"""Error classes: one base, each also a fitting built-in so callers can catch either."""

from __future__ import annotations

__all__ = [
    "ParaflowError",
    "UnknownBackendError",
    "BackendUnavailableError",
    "MissingDependencyError",
    "LauncherError",
    "CollectiveError",
    "CollectiveTimeoutError",
    "ConfigurationError",
    "CheckpointError",
]


class ParaflowError(Exception):
    """Base of every error paraflow raises on purpose."""


class UnknownBackendError(ParaflowError, ValueError):
    """A backend name that is not registered."""


class BackendUnavailableError(ParaflowError, RuntimeError):
    """A registered backend that cannot run on this machine or under this launcher."""


class MissingDependencyError(ParaflowError, ImportError):
    """An optional package a feature needs is not installed."""


class LauncherError(ParaflowError, RuntimeError):
    """The launcher environment is missing, half-set or inconsistent."""


class CollectiveError(ParaflowError, RuntimeError):
    """A collective was called with inputs that do not agree across ranks."""


class CollectiveTimeoutError(CollectiveError, TimeoutError):
    """A collective did not complete within the configured timeout."""


class ConfigurationError(ParaflowError, ValueError):
    """An option or argument with a value paraflow cannot use."""


class CheckpointError(ParaflowError, OSError):
    """A checkpoint could not be written or read; a previous file at the path is left intact."""
