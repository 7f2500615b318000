"""The machine speed probe: a fixed kernel timed after every launch, summarised and compared."""

import torch

from paraflow.bench.driver.runner import probe_ms, probe_summary
from paraflow.bench.report.compare import compare_runs, report
from paraflow.bench.report.header import probe_line


def test_the_probe_times_its_kernel_on_one_thread_and_restores_the_thread_count():
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # the driver's own count: the probe must not time its kernel with it
    seen = []
    original = torch.Tensor.__matmul__

    def spy(a, b):
        seen.append(torch.get_num_threads())
        return original(a, b)

    torch.Tensor.__matmul__ = spy
    try:
        ms = probe_ms()
    finally:
        torch.Tensor.__matmul__ = original
        after = torch.get_num_threads()
        torch.set_num_threads(before)
    assert ms > 0 and seen and set(seen) == {1} and after == 2


def test_the_summary_gives_median_range_and_spread_of_the_launches_probes():
    cells = [{"probe_ms": v} for v in (10.0, 12.0, 11.0, 20.0)] + [{"probe_ms": None}, {}]
    summary = probe_summary(cells)
    assert summary["count"] == 4 and summary["median_ms"] == 11.5
    assert (summary["min_ms"], summary["max_ms"]) == (10.0, 20.0) and summary["spread"] == round(10 / 11.5, 4)
    assert "median 11.5 ms, 10–20 ms (87% spread)" in probe_line(summary)
    assert probe_summary([{"probe_ms": None}]) is None


def _run(probe_median):
    header = {} if probe_median is None else {"speed_probe": probe_summary([{"probe_ms": probe_median}])}
    return {"header": header, "tables": {"training": []}, "verdict": []}


def test_compare_says_how_much_slower_the_machine_itself_was_in_the_second_run():
    result = compare_runs(_run(10.0), _run(12.5))
    assert result["probe"]["ratio"] == 1.25
    assert "during B the machine itself was 25.0% slower than during A" in report("A", "B", result)
    faster = report("A", "B", compare_runs(_run(10.0), _run(8.0)))
    assert "20.0% faster than during A" in faster
    # results from before the probe: nothing said
    older = compare_runs(_run(None), _run(12.5))
    assert older["probe"] is None and "machine itself" not in report("A", "B", older)
