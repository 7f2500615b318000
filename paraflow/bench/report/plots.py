"""throughput.png with matplotlib's Agg backend: each configuration's throughput against process count,
with its 95% intervals and the ideal line of n times the single baseline."""

from __future__ import annotations

import textwrap
from pathlib import Path

from ...errors import MissingDependencyError
from .header import busy_warning, header_lines

__all__ = ["write_plots", "require_pyplot", "throughput_figure", "footer"]


def require_pyplot():
    """matplotlib.pyplot on the Agg backend, or a clear error saying how to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependencyError(
            "the benchmark plots need matplotlib, which is not installed; install the benchmark extras: "
            "`pip install 'paraflow[bench]'`, or run with --no-plots."
        ) from None
    return plt


def footer(fig, header: dict) -> float:
    """Write the header under the plot, wrapped to the figure's width; returns its height (0..1)."""
    lines = header_lines(header, with_commands=False)[:4] + ["exact commands: results.md"]
    warning = busy_warning(header)
    if warning:
        lines.append(warning)
    width = int(fig.get_figwidth() * 17)  # 6.5 pt monospace: about 17 characters per inch
    wrapped = [part for line in lines for part in textwrap.wrap(line, width, subsequent_indent="  ")]
    fig.text(
        0.01,
        0.01,
        "\n".join(wrapped),
        fontsize=6.5,
        family="monospace",
        va="bottom",
        ha="left",
        color="#444444" if not warning else "#a01010",
    )
    return (len(wrapped) * 0.115 + 0.15) / fig.get_figheight()


def _yerr(points: list, key: str) -> list:
    """Error-bar lengths below and above each point's value (its 95% interval), 0 where it has none."""
    below = [p[key] - p[f"{key}_low"] if p.get(f"{key}_low") is not None else 0 for p in points]
    above = [p[f"{key}_high"] - p[key] if p.get(f"{key}_high") is not None else 0 for p in points]
    return [below, above]


def throughput_figure(rows: list, header: dict):
    """The throughput figure (matplotlib), one panel per model, error bars from the intervals."""
    plt = require_pyplot()
    ok = [r for r in rows if r["status"].startswith("ok") and r["samples_per_s"] is not None and r["scaling"] == "weak"]
    models = list(dict.fromkeys(r["model"] for r in ok))
    fig, axes = plt.subplots(1, len(models), figsize=(5.2 * len(models), 5.4), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [r for r in ok if r["model"] == model]
        base = next((r for r in mine if r["backend"] == "single"), None)
        counts = sorted({r["processes"] for r in mine})
        series = {}
        for r in mine:
            series.setdefault(f"{r['backend']} · {r['launcher']}", []).append(r)
        for label, points in series.items():
            points.sort(key=lambda r: r["processes"])
            ax.errorbar(
                [p["processes"] for p in points],
                [p["samples_per_s"] for p in points],
                yerr=_yerr(points, "samples_per_s"),
                marker="o",
                capsize=3,
                linestyle="-" if len(points) > 1 else "none",
                label=label,
            )
        if base:
            ideal = [base["samples_per_s"] * n for n in counts]
            ax.plot(counts, ideal, color="grey", linestyle="--", linewidth=1, label="ideal: n × single")
        ax.set_title(model, fontsize=10)
        ax.set_xlabel("processes")
        ax.set_ylabel("samples/s (global)")
        ax.set_xticks(counts)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        "Training throughput against process count (weak scaling: fixed batch per process; "
        "bars: 95% intervals over launches)"
    )
    fig.tight_layout(rect=(0, footer(fig, header), 1, 0.95))
    return fig


def _save(fig, path: Path) -> None:
    fig.savefig(path, dpi=110)
    require_pyplot().close(fig)


def write_plots(results: dict, out: Path) -> list:
    """throughput.png when a training row has a throughput; returns the file names written."""
    training, header = results["tables"]["training"], results["header"]
    if not any(r["status"].startswith("ok") and r["samples_per_s"] is not None for r in training):
        return []
    _save(throughput_figure(training, header), out / "throughput.png")
    return ["throughput.png"]
