"""The PNG of :mod:`benchmarks.peers` (the style of :mod:`benchmarks.streaming_speed_plot`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.results_file import save_figure


def plot(doc: Mapping[str, Any], path: Path) -> None:
    """Three panels: throughput per batch size, latency p50/p99, duplicates and losses under faults."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = doc.get("summary") or {}
    peers = [p for p in doc["config"]["peers"] if p in summary]  # the JSON's keys come back sorted
    labels = [f"({summary[p]['letter']}) {p}" for p in peers]
    sizes = doc["config"]["batch_sizes"]
    fig, ax = plt.subplots(1, 3, figsize=(18, 6))
    width = 0.8 / max(1, len(sizes))
    for i, size in enumerate(sizes):
        vals = [summary[p]["throughput"][str(size)]["best_rows_per_s"] or 0 for p in peers]
        ax[0].bar([x + i * width for x in range(len(peers))], vals, width, label=f"{size:,} per batch")
    ax[0].set_xticks([x + width * (len(sizes) - 1) / 2 for x in range(len(peers))], labels, rotation=20, ha="right")
    ax[0].set_ylabel("rows/s (best of the rounds)")
    ax[0].set_title(f"throughput, {doc['config']['events']:,} events, {doc['config']['rounds']} rounds interleaved")
    if any(summary[p]["latency"].get("p50_ms") for p in peers):
        for i, (key, name) in enumerate((("p50_ms", "p50"), ("p99_ms", "p99"))):
            vals = [summary[p]["latency"].get(key) or 0 for p in peers]
            ax[1].bar([x + i * 0.4 for x in range(len(peers))], vals, 0.4, label=name)
        ax[1].set_xticks([x + 0.2 for x in range(len(peers))], labels, rotation=20, ha="right")
        ax[1].set_ylabel("ms, Kafka timestamp -> visible (read committed)")
        ax[1].set_title("latency, 1 s trigger (engine: 1 s flush), half the sustained rate")
    else:  # --skip-latency
        ax[1].set_axis_off()
        ax[1].text(0.5, 0.5, "latency not measured in this run", ha="center", va="center", transform=ax[1].transAxes)
    faults = [summary[p]["faults"] for p in peers]
    if any(faults):
        top = 1
        for i, key in enumerate(("duplicates", "lost")):
            vals = [(f or {}).get(key) or 0 for f in faults]
            top = max([top, *vals])
            ax[2].bar([x + i * 0.4 for x in range(len(peers))], vals, 0.4, label=key)
        for x, f in enumerate(faults):  # the counts, legible when they are 0
            if f:
                ax[2].annotate(
                    f"{f['duplicates']} / {f['lost']}",
                    (x + 0.2, 0),
                    xytext=(0, 4),
                    textcoords="offset points",
                    ha="center",
                    fontsize=8,
                )
        ax[2].set_ylim(0, top * 1.15)
        ax[2].set_xticks([x + 0.2 for x in range(len(peers))], labels, rotation=20, ha="right")
        ax[2].set_ylabel("records (labels: duplicates / lost)")
        ax[2].set_title("under faults: ClickHouse killed twice, (a)/(b) driver killed")
    else:
        ax[2].set_axis_off()
    for x in ax:
        x.grid(alpha=0.3, axis="y")
        if x.get_legend_handles_labels()[0]:
            x.legend(fontsize=8)
    fig.suptitle(
        f"peers: local[2], 2 shared cores, {doc['config']['partitions']} partitions, "
        f"kafka.client {doc['config'].get('kafka_client', 'auto')} (PEER@CLIENT: that client), "
        f"load average {doc['config'].get('machine', {}).get('load_average')}",
        fontsize=10,
    )
    save_figure(fig, path)
