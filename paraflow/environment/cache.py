"""paraflow's folder of kept files (built wheels, example data)."""

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/paraflow``, else ``~/.cache/paraflow``; it may not exist yet."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "paraflow"
