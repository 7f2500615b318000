"""projection.png: projected weak-scaling efficiency against host count, with the measured points."""

from __future__ import annotations

from .plots import footer, require_pyplot

__all__ = ["projection_figure"]

_STYLE = {"as fitted": ":", "10 Gbit/s": "--", "100 Gbit/s": "-"}


def projection_figure(tables: dict, header: dict):
    """One panel per model: a projected line per backend and link, the measured rows as points."""
    plt = require_pyplot()
    rows, details = tables["projection"], tables.get("predictions", [])
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(5.6 * len(models), 5.8), squeeze=False)
    for ax, model in zip(axes[0], models):
        colors: dict = {}
        for r in (r for r in rows if r["model"] == model):
            series = f"{r['backend']} · {r['launcher']}"
            colors.setdefault(series, f"C{len(colors)}")
        lines: dict = {}
        for r in (r for r in rows if r["model"] == model):
            series = f"{r['backend']} · {r['launcher']}"
            link = "as fitted" if r["link"].startswith("as fitted") else r["link"]
            lines.setdefault((series, link), []).append(r)
        for (series, link), points in lines.items():
            points.sort(key=lambda p: p["hosts"])
            ax.plot(
                [p["hosts"] for p in points],
                [p["efficiency"] * 100 for p in points],
                linestyle=_STYLE.get(link, "-."),
                color=colors[series],
                label=f"{series}, {link} (projected)",
            )
        for d in (d for d in details if d["model"] == model and d["scaling"] == "weak"):
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
