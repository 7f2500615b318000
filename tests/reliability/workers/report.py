"""How fault workers report to the test: one ``EVENT {json}`` line on stdout per record."""

import json
import sys


def emit(fields: dict) -> None:
    """Write one record as a single line in one write, so ranks sharing a pipe do not interleave it."""
    sys.stdout.write("EVENT " + json.dumps(fields) + "\n")
    sys.stdout.flush()
