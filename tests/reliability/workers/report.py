"""How fault workers report to the test: one ``EVENT {json}`` line per record.

The line goes to the file named by ``FAULT_EVENTS`` when it is set (appended in one write, so
ranks' records never mix), else to stdout. A launcher that forwards the ranks' output in chunks
(mpirun does, 4 KB at a time) can cut one rank's line and put another rank's output into it.
"""

import json
import os
import sys

EVENTS_ENV = "FAULT_EVENTS"


def emit(fields: dict) -> None:
    """Write one record as a single line in one write."""
    line = "EVENT " + json.dumps(fields) + "\n"
    path = os.environ.get(EVENTS_ENV)
    if not path:
        sys.stdout.write(line)
        sys.stdout.flush()
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
