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
    "RankFailedError",
    "LaunchTimeoutError",
    "NotInitializedError",
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


class RankFailedError(ParaflowError, RuntimeError):
    """A process started by `paraflow.launch` raised or died; names the rank, carries its traceback.

    Attributes:
        rank: the rank that failed first.
        error_type: the name of what it raised ("ValueError"), or how it died ("SIGKILL").
        traceback: that rank's traceback text (or its last lines of output when it died without one).
        others: the other ranks that failed too, rank -> one line each.
    """

    def __init__(self, message: str, rank: int, error_type: str, traceback: str, others: dict) -> None:
        super().__init__(message)
        self.rank = rank
        self.error_type = error_type
        self.traceback = traceback
        self.others = others


class LaunchTimeoutError(ParaflowError, TimeoutError):
    """Processes started by `paraflow.launch` did not finish in time; all were stopped.

    Attributes:
        unfinished: the ranks still running at the time limit.
    """

    def __init__(self, message: str, unfinished: list) -> None:
        super().__init__(message)
        self.unfinished = unfinished


class NotInitializedError(ParaflowError, RuntimeError):
    """A call that needs the job (a collective, wrap_model) on a backend not initialised or already shut down."""
