"""The stacked bars of :mod:`benchmarks.cpu_profile`: CPU-seconds per million events by
component, a bar per run, the whole job and the window after the first micro-batch."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.cpu_sampler import JOB_COMPONENTS, STACK_COMPONENTS
from benchmarks.results_file import save_figure

#: The components in the order of the bars (bottom up).
COMPONENTS = (*JOB_COMPONENTS, "job_unsampled", *STACK_COMPONENTS.values())


def plot(doc: Mapping[str, Any], path: Path) -> None:
    """Two panels (whole run, after the first batch): a stacked bar per subject."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = doc["runs"]
    fig, axes = plt.subplots(1, 2, figsize=(18, 6.5), sharey=False)
    for ax, win, title in (
        (axes[0], "whole", "whole job (JVM start, first batch included)"),
        (axes[1], "steady", "after the first micro-batch"),
    ):
        labels = [r["subject"] + (f" #{r['round']}" if doc["config"].get("rounds", 1) > 1 else "") for r in runs]
        bottom = [0.0] * len(runs)
        for comp in COMPONENTS:
            vals = [float((r.get(win) or {}).get("cpu_s_per_million", {}).get(comp, 0.0)) for r in runs]
            if any(vals):
                ax.bar(range(len(runs)), vals, 0.6, bottom=bottom, label=comp)
                bottom = [b + v for b, v in zip(bottom, vals)]
        for x, total in enumerate(bottom):
            ax.annotate(f"{total:,.0f}", (x, total), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=8)
        ax.set_xticks(range(len(runs)), labels, rotation=20, ha="right")
        ax.set_ylabel("CPU-seconds per million events")
        ax.set_title(title)
        ax.grid(alpha=0.3, axis="y")
    handles, names = axes[0].get_legend_handles_labels()
    # beside the bars, the top of the stack first
    axes[1].legend(handles[::-1], names[::-1], fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    cfg = doc["config"]
    fig.suptitle(
        f"CPU by component: {cfg['events']:,} events, {cfg['partitions']} partitions, batches of {cfg['batch']:,}, "
        f"local[2], load average {cfg.get('machine', {}).get('load_average')} at the end",
        fontsize=10,
    )
    save_figure(fig, path)
