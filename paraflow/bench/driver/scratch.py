"""Scratch directories for one benchmark launch, removed when it ends however it ended.

A launch's processes leave files in shared places, and a launch killed at its timeout leaves
them for good: Open MPI's session directory under TMPDIR and its shared-memory segments in
/dev/shm (4 MB per rank), torchrun's ``torchelastic_*`` log directory under TMPDIR. Each launch
gets a directory of its own as TMPDIR and another, in /dev/shm, as Open MPI's shared-memory
backing directory (unless the environment names one already).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

__all__ = ["launch_scratch", "OMPI_SHARED_MEMORY"]

#: Open MPI's MCA parameter for where its shared-memory transport puts its backing files.
OMPI_SHARED_MEMORY = "OMPI_MCA_btl_vader_backing_directory"
_SHM = "/dev/shm"


@contextlib.contextmanager
def launch_scratch(prefix: str = "pf-", tmp_variable: str = "TMPDIR") -> Iterator[dict]:
    """Yields the variables that point a launch at fresh scratch directories (`tmp_variable` at one
    in the temporary directory, Open MPI's backing directory at one in /dev/shm); removes them on exit."""
    made = [tempfile.mkdtemp(prefix=prefix)]
    env = {tmp_variable: made[0]}
    try:
        if OMPI_SHARED_MEMORY not in os.environ and os.access(_SHM, os.W_OK):
            made.append(tempfile.mkdtemp(prefix=prefix, dir=_SHM))
            env[OMPI_SHARED_MEMORY] = made[-1]
        yield env
    finally:
        for path in made:
            shutil.rmtree(path, ignore_errors=True)
