"""The progress display: about ten plain lines off a terminal, every failure, the time left."""

from __future__ import annotations

import io

from paraflow.bench.driver.progress import LaunchProgress, clock


def test_plain_progress_prints_about_ten_lines_and_every_failure():
    stream = io.StringIO()
    progress = LaunchProgress(stream, 40)
    for i in range(40):
        progress.begin(f"cell {i}")
        progress.end(i != 7, "ok" if i != 7 else "FAILED: boom", 1.0)
    lines = stream.getvalue().splitlines()
    assert 10 <= len(lines) <= 12 and lines[0].startswith("[ 1/40]") and lines[-1].startswith("[40/40]")
    assert any("cell 7 · FAILED: boom" in line for line in lines)
    assert any(line.startswith("[20/40] 0:00 elapsed, ~0:20 left · cell 19") for line in lines)  # median x left
    assert lines[-1].split(" elapsed")[1].startswith(", ~0:00 left")


def test_clock():
    assert clock(0) == "0:00" and clock(61.9) == "1:01" and clock(-3) == "0:00"
