"""PNG plots with matplotlib's Agg backend: throughput against process count, busbw against size,
and the projected weak-scaling efficiency against host count with the measured points."""

from __future__ import annotations

import textwrap
from pathlib import Path

from ...errors import MissingDependencyError
from .header import busy_warning, header_lines
from .tables import BREAKDOWN_COLUMNS

__all__ = ["write_plots", "size_label", "require_pyplot", "throughput_figure", "busbw_figure", "projection_figure"]
__all__ += ["breakdown_figure", "footer"]


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


def size_label(size: int) -> str:
    """4096 -> 4K, 67108864 -> 64M (powers of 1024, as the sizes were given)."""
    for unit, scale in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


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


def busbw_figure(rows: list, header: dict):
    """The bus-bandwidth figure (matplotlib), one panel per collective, error bars from the intervals."""
    plt = require_pyplot()
    ok = [r for r in rows if r["status"].startswith("ok") and r.get("size_bytes") is not None]
    panels = list(dict.fromkeys(r["collective"] for r in ok))
    fig, axes = plt.subplots(1, len(panels), figsize=(8 * len(panels), 6.2), squeeze=False)
    for ax, collective in zip(axes[0], panels):
        series: dict = {}
        for r in ok:
            if r["collective"] == collective:
                series.setdefault(f"{r['backend']} · {r['launcher']} · {r['processes']} procs", []).append(r)
        for label, points in series.items():
            sizes = [p["size_bytes"] for p in points]
            line = None
            if any(p["busbw"] is not None for p in points):
                line = ax.errorbar(
                    sizes,
                    [p["busbw"] for p in points],
                    yerr=_yerr(points, "busbw"),
                    marker="o",
                    capsize=3,
                    label=f"{label}: paraflow",
                )
            color = line[0].get_color() if line else None
            ax.errorbar(
                sizes,
                [p["raw_busbw"] for p in points],
                yerr=_yerr(points, "raw_busbw"),
                marker="x",
                capsize=3,
                linestyle=":",
                color=color,
                label=f"{label}: raw library",
            )
        sizes = sorted({r["size_bytes"] for r in ok if r["collective"] == collective})
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes)
        ax.set_xticklabels([size_label(s) for s in sizes])
        ax.minorticks_off()
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("busbw (GB/s; GB = 1e9 bytes)")
        ax.set_title(f"{collective} float32: bus bandwidth (bars: 95% intervals over launches)", fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.tight_layout(rect=(0, footer(fig, header), 1, 1))
    return fig


_COLOURS = {"compute_ms": "#4878a8", "exposed_comm_ms": "#d0603a", "optimizer_ms": "#6aa56a", "other_ms": "#b0b0b0"}


def breakdown_figure(rows: list, header: dict):
    """Stacked bars per model: each row's compute, exposed communication, optimizer and other (ms),
    with overlapped communication as a hatched bar beside them (it runs during compute)."""
    plt = require_pyplot()
    ok = [r for r in rows if r["status"].startswith("ok") and r.get("compute_ms") is not None]
    models = list(dict.fromkeys((r["model"], r["scaling"]) for r in ok))
    fig, axes = plt.subplots(
        1, len(models), figsize=(max(5.2, 1.3 * len(ok) / max(1, len(models)) + 2.5) * len(models), 5.8), squeeze=False
    )
    for ax, (model, scaling) in zip(axes[0], models):
        mine = [r for r in ok if r["model"] == model and r["scaling"] == scaling]
        names = [f"{r['backend']}\n{r['launcher']} ×{r['processes']}" for r in mine]
        xs = list(range(len(mine)))
        bottom = [0.0] * len(mine)
        for key, colour in _COLOURS.items():
            heights = [max(0.0, r[key] or 0.0) for r in mine]
            ax.bar(xs, heights, 0.55, bottom=bottom, color=colour, label=BREAKDOWN_COLUMNS[key])
            bottom = [b + h for b, h in zip(bottom, heights)]
        overlapped = [r.get("overlapped_comm_ms") or 0.0 for r in mine]
        ax.bar(
            [x + 0.36 for x in xs],
            overlapped,
            0.15,
            color="white",
            edgecolor="#d0603a",
            hatch="///",
            label="overlapped comm ms (during compute)",
        )
        ax.scatter(
            xs, [r["step_ms_median"] for r in mine], marker="_", s=400, color="black", zorder=3, label="step ms median"
        )
        ax.set_xticks(xs)
        ax.set_xticklabels(names, fontsize=7)
        ax.set_ylabel("ms per step (median over launches)")
        ax.set_title(f"{model}, {scaling} scaling", fontsize=10)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
    fig.suptitle("Where a step's time goes (parts add up to the synced step of the interleaved pairs)")
    fig.tight_layout(rect=(0, footer(fig, header), 1, 0.95))
    return fig


def _save(fig, path: Path) -> None:
    fig.savefig(path, dpi=110)
    require_pyplot().close(fig)


def write_plots(results: dict, out: Path) -> list:
    """throughput.png, busbw.png and projection.png (when there is something to draw); returns the file names."""
    tables, header = results["tables"], results["header"]
    written = []
    if any(r["status"].startswith("ok") and r["samples_per_s"] is not None for r in tables["training"]):
        _save(throughput_figure(tables["training"], header), out / "throughput.png")
        written.append("throughput.png")
    if any(r["status"].startswith("ok") and r.get("size_bytes") is not None for r in tables["sweep"]):
        _save(busbw_figure(tables["sweep"], header), out / "busbw.png")
        written.append("busbw.png")
    if any(r["status"].startswith("ok") and r.get("compute_ms") is not None for r in tables["training"]):
        _save(breakdown_figure(tables["training"], header), out / "breakdown.png")
        written.append("breakdown.png")
    if tables.get("projection"):
        _save(projection_figure(tables, header), out / "projection.png")
        written.append("projection.png")
    return written


_PROJECTION_STYLE = {"as fitted": ":", "10 Gbit/s": "--", "100 Gbit/s": "-"}


def projection_figure(tables: dict, header: dict):
    """One panel per model: a projected line per backend and link, the measured rows as points."""
    plt = require_pyplot()
    rows, details = tables["projection"], tables.get("predictions", [])
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(5.6 * len(models), 5.8), squeeze=False)
    for ax, model in zip(axes[0], models):
        colors: dict = {}
        lines: dict = {}
        for r in (r for r in rows if r["model"] == model):
            series = f"{r['backend']} · {r['launcher']}"
            colors.setdefault(series, f"C{len(colors)}")
            link = "as fitted" if r["link"].startswith("as fitted") else r["link"]
            lines.setdefault((series, link), []).append(r)
        for (series, link), points in lines.items():
            points.sort(key=lambda p: p["hosts"])
            ax.plot(
                [p["hosts"] for p in points],
                [p["efficiency"] * 100 for p in points],
                linestyle=_PROJECTION_STYLE.get(link, "-."),
                color=colors[series],
                label=f"{series}, {link} (projected)",
            )
        for d in (
            d for d in details if d["model"] == model and d["scaling"] == "weak" and d.get("status", "ok") == "ok"
        ):
            series = f"{d['backend']} · {d['launcher']}"
            color = colors.get(series, "black")
            if d.get("scaling_efficiency") is not None:
                ax.plot(d["processes"], d["scaling_efficiency"] * 100, "o", color=color, label=f"{series}: measured")
            ax.plot(
                d["processes"],
                d["compute_ms"] / d["predicted_step_ms"] * 100,
                "x",
                color=color,
                label=f"{series}: predicted at {d['processes']}",
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("hosts (one rank per host)")
        ax.set_ylabel("weak-scaling efficiency (%)")
        ax.set_ylim(0, 110)
        ax.set_title(model, fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=6)
    fig.suptitle(
        "PROJECTION from the α-β cost model (not measured): lines projected, points measured here "
        "(o: measured efficiency against single; x: the model's prediction for that row)",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, footer(fig, header), 1, 0.95))
    return fig
