"""Backend implementations; each module is imported only when its backend is used."""

from .base import Backend

__all__ = ["Backend"]
