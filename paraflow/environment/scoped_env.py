"""Environment variables set for a while and put back as they were afterwards."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Optional

__all__ = ["ScopedEnv"]


class ScopedEnv:
    """Set variables in ``os.environ`` now; :meth:`restore` puts back what was there before."""

    def __init__(self) -> None:
        self._saved: dict[str, Optional[str]] = {}

    def set(self, variables: Mapping[str, str]) -> None:
        """Set each variable, remembering its value from before the first ``set`` of it."""
        for key, value in variables.items():
            self._saved.setdefault(key, os.environ.get(key))
            os.environ[key] = value

    def restore(self) -> None:
        """Put every variable set since the last restore back as it was (unset if it was unset)."""
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved.clear()
