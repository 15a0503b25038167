"""The PNG of :mod:`benchmarks.streaming_speed`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.results_file import save_figure
from benchmarks.streaming_speed_figures import MODES, steady


def plot(doc: Mapping[str, Any], path: Path) -> None:
    """Three panels: availableNow throughput, latency per trigger, the ramp."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(18, 6), gridspec_kw={"width_ratios": [1.6, 1, 1]})
    names = ["batch noop"] + [f"stream {r['sink']}" for r in doc["available_now"]]
    vals = [doc["batch_noop"]["rows_per_s"]] + [r.get("rows_per_s") or 0 for r in doc["available_now"]]
    med = (doc.get("noop_rounds") or {}).get("median") or {}
    names += [f"median {k}" if k == "batch" else f"median noop, {k}" for k in med]
    vals += [v or 0 for v in med.values()]
    sinks = (doc.get("noop_rounds") or {}).get("batch_sink_median") or {}
    names += [f"median batch -> {k}" for k in sinks]
    vals += [v or 0 for v in sinks.values()]
    split = {k: v for k, v in ((doc.get("noop_rounds") or {}).get("split_median") or {}).items() if k != "noop"}
    colors = ["grey"] + ["C0"] * (len(names) - 1 - len(sinks)) + ["grey"] * len(sinks) + ["C1"] * len(split)
    names += [f"median {k}" for k in split]
    vals += [v.get("rows_per_s") or 0 for v in split.values()]
    ax[0].bar(range(len(names)), vals, color=colors)
    ax[0].set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax[0].set_ylabel("rows/s")
    ax[0].set_title("kafka_py, availableNow (batch = ceiling)")
    runs = [r for r in doc.get("triggers", []) if "error" not in r]
    for m in MODES:
        rs = sorted((r for r in runs if r["mode"] == m), key=lambda r: r["trigger_s"])
        if rs:
            xs = [r["trigger_s"] for r in rs]
            ax[1].plot(xs, [(r["latency_ms"] or {}).get("p50") for r in rs], marker="o", label=f"{m} p50")
            ax[1].plot(xs, [(r["latency_ms"] or {}).get("p99") for r in rs], marker="x", ls="--", label=f"{m} p99")
    ax[1].set_xscale("log")
    ax[1].set_xlabel("trigger interval (s)")
    ax[1].set_ylabel("ms, Kafka timestamp -> visible (read committed)")
    ax[1].set_title(f"end-to-end latency at {doc['config']['rate']:g} events/s offered")
    for m, rp in (doc.get("ramp") or {}).items():
        rs = [r for r in rp["runs"] if "error" not in r]
        ax[2].plot([r["rate"] for r in rs], [steady(r).get("mean_batch_ms") for r in rs], marker="o", label=m)
    ax[2].axhline(1000, color="grey", ls=":", lw=1, label="1 s trigger")
    ax[2].set_xscale("log")
    ax[2].set_xlabel("offered events/s")
    ax[2].set_ylabel("mean batch ms")
    ax[2].set_title("ramp: keeps up while a batch fits the trigger")
    for x in ax:
        x.grid(alpha=0.3)
    for x in ax[1:]:
        if x.get_legend_handles_labels()[0]:  # no lines when the pipeline runs were skipped
            x.legend(fontsize=7)
    fig.suptitle(f"streaming_speed: local[2], 2 shared cores, {doc['config']['partitions']} partitions", fontsize=10)
    save_figure(fig, path)
