"""Throughput and latency of each commit mode against at-least-once, per trigger interval.

``python -m benchmarks.checkpoint_sweep [--quick]`` (Alibaba EMR's Figure 8, Kafka
Streams' Figure 5): for every trigger interval (1, 5, 10, 30, 60 s) and every mode
(``none`` = at-least-once baseline, ``transaction``, ``staging``, ``dedup``) it runs
:func:`spark_datasource.testing.pipeline.run_pipeline` without crashes while a producer offers a
steady ``--rate`` of events, and records:

- ``processing_rps``: rows / time spent in micro-batches (Spark's
  ``triggerExecution``, which includes the sink's prepare and its 2PC commit). With
  a steady offered rate the batch size is ``rate × interval``, so this is the rate
  the job sustains at that batch size; per-batch commit costs show up as overhead
  that shrinks as the interval grows.
- end-to-end latency p50/p99: Kafka record timestamp → the record visible to a
  *read-committed* reader. A thread polls ``max(offset)`` per partition with
  ``implicit_transaction=1`` every 100 ms; a record's latency is the first poll that
  shows it minus its Kafka timestamp (so up to +100 ms of measurement error, the
  same for every mode). We poll instead of storing ``now64()`` with a column
  DEFAULT because ``now64()`` is the *insert* time: in ``transaction`` and ``staging``
  mode rows are inserted long before they become visible (COMMIT, MOVE PARTITION),
  and that delay is exactly the cost being measured.
- the overhead of each mode over ``none`` at the same interval, in throughput (%)
  and in p50 latency (ms).

Writes JSON (all runs plus the overheads) and a PNG (matplotlib, Agg). One embedded
stack serves every run; each run has its own topic, table and checkpoint.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from benchmarks.results_file import save_figure, write_result
from spark_datasource.testing.pipeline import run_pipeline
from spark_datasource.testing.pipeline_config import PipelineConfig

INTERVALS = (1.0, 5.0, 10.0, 30.0, 60.0)
QUICK_INTERVALS = (1.0, 10.0)
MODES = ("none", "transaction", "staging", "dedup")
RESULTS = Path(__file__).resolve().parent / "results"


def run_duration(interval: float, base_s: float) -> float:
    """Seconds of steady production for one run: at least 3 batches of ``interval``."""
    return max(base_s, 3 * interval + 2)


def overheads(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (interval, mode != none): throughput and latency overhead over ``none``."""
    base = {r["trigger_s"]: r for r in runs if r["mode"] == "none" and r.get("processing_rps")}
    out = []
    for r in runs:
        b = base.get(r["trigger_s"])
        if r["mode"] == "none" or b is None or not r.get("processing_rps"):
            continue
        lat, blat = r.get("latency_ms") or {}, b.get("latency_ms") or {}
        out.append(
            {
                "trigger_s": r["trigger_s"],
                "mode": r["mode"],
                "throughput_overhead_pct": round(100 * (1 - r["processing_rps"] / b["processing_rps"]), 1),
                "p50_latency_overhead_ms": (
                    round(lat["p50"] - blat["p50"], 1)
                    if lat.get("p50") is not None and blat.get("p50") is not None
                    else None
                ),
                "p99_latency_overhead_ms": (
                    round(lat["p99"] - blat["p99"], 1)
                    if lat.get("p99") is not None and blat.get("p99") is not None
                    else None
                ),
            }
        )
    return out


def plot(doc: dict[str, Any], path: Path) -> None:
    """Three panels: processing rate, latency p50/p99, throughput overhead over ``none``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in doc["runs"] if r.get("processing_rps")]
    modes = [m for m in MODES if any(r["mode"] == m for r in runs)]
    intervals = sorted({r["trigger_s"] for r in runs})
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.8))
    for m in modes:
        rs = sorted((r for r in runs if r["mode"] == m), key=lambda r: r["trigger_s"])
        xs = [r["trigger_s"] for r in rs]
        ax[0].plot(xs, [r["processing_rps"] for r in rs], marker="o", label=m)
        ax[1].plot(xs, [(r["latency_ms"] or {}).get("p50") for r in rs], marker="o", label=f"{m} p50")
        ax[1].plot(xs, [(r["latency_ms"] or {}).get("p99") for r in rs], marker="x", ls="--", label=f"{m} p99")
    for a in ax[:2]:
        a.set_xscale("log")
        a.set_xticks(intervals, [f"{i:g}" for i in intervals])
        a.set_xlabel("trigger interval (s)")
    ax[0].set_ylabel("rows/s while processing")
    ax[0].set_title("processing rate")
    ax[1].set_ylabel("ms, Kafka timestamp -> visible (read committed)")
    ax[1].set_yscale("log")
    ax[1].set_title("end-to-end latency")
    ov = doc["overheads"]
    em = [m for m in modes if m != "none"]
    width = 0.8 / max(1, len(em))
    for i, m in enumerate(em):
        pts = {o["trigger_s"]: o["throughput_overhead_pct"] for o in ov if o["mode"] == m}
        ax[2].bar([j + i * width for j in range(len(intervals))], [pts.get(t, 0) for t in intervals], width, label=m)
    ax[2].axhline(10, color="grey", ls=":", lw=1, label="10% target")
    ax[2].axhline(0, color="black", lw=0.5)
    ax[2].set_xticks([j + width * (len(em) - 1) / 2 for j in range(len(intervals))], [f"{t:g}" for t in intervals])
    ax[2].set_xlabel("trigger interval (s)")
    ax[2].set_ylabel("% throughput below at-least-once")
    ax[2].set_title("overhead over at-least-once (none)")
    for a in ax:
        a.legend(fontsize=7)
        a.grid(alpha=0.3)
    env = doc["config"]
    fig.suptitle(
        f"clickhouse-tx modes vs trigger interval: {env['rate']:g} events/s offered, "
        f"{env['partitions']} partitions, local[2] on 2 cores",
        fontsize=10,
    )
    save_figure(fig, path)


@dataclasses.dataclass(frozen=True)
class SweepPlan:
    """What one sweep runs and where it writes, from the command line."""

    quick: bool
    intervals: list[float]
    modes: list[str]  # ``none`` first when asked for: the baseline of the overheads
    rate: float
    partitions: int
    base_s: float
    json_path: Path
    png_path: Path


def sweep_plan(argv: Sequence[str] | None = None) -> SweepPlan:
    """Parse the command line (``None``: ``sys.argv``) into the sweep's plan, defaults filled in."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.checkpoint_sweep", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"intervals {QUICK_INTERVALS}, shorter runs")
    ap.add_argument("--intervals", default=None, help="comma-separated seconds (default 1,5,10,30,60)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--rate", type=float, default=None, help="offered events/s (default 4000, quick 2000)")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument(
        "--duration",
        type=float,
        default=None,
        help="seconds of production per run, at least 3 intervals (default 40, quick 20)",
    )
    ap.add_argument("--json", default=None, help="default benchmarks/results/checkpoint_sweep[_quick].json")
    ap.add_argument("--png", default=None, help="default next to the JSON")
    a = ap.parse_args(argv)
    intervals = (
        [float(x) for x in a.intervals.split(",")] if a.intervals else list(QUICK_INTERVALS if a.quick else INTERVALS)
    )
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if "none" in modes:
        modes = ["none"] + [m for m in modes if m != "none"]
    name = "checkpoint_sweep_quick" if a.quick else "checkpoint_sweep"
    jpath = Path(a.json) if a.json else RESULTS / f"{name}.json"
    return SweepPlan(
        quick=a.quick,
        intervals=intervals,
        modes=modes,
        rate=a.rate or (2000.0 if a.quick else 4000.0),
        partitions=a.partitions,
        base_s=a.duration or (20.0 if a.quick else 40.0),
        json_path=jpath,
        png_path=Path(a.png) if a.png else jpath.with_suffix(".png"),
    )


def _run_one(plan: SweepPlan, info: Any, work_dir: Path, interval: float, mode: str, seed: int, t0: float) -> dict:
    """One pipeline run of ``mode`` at ``interval``: its result, or its error recorded."""
    cfg = PipelineConfig(
        events=int(plan.rate * run_duration(interval, plan.base_s)),
        partitions=plan.partitions,
        mode=mode,
        trigger=interval,
        crashes=0,
        rate=plan.rate,
        url=info.clickhouse_url,
        bootstrap=str(info.kafka_bootstrap),
        kafka_control=info.kafka_control,
        work_dir=str(work_dir),
        measure_latency=True,
        quiet=True,
        seed=seed,
    )
    print(
        f"[{time.monotonic() - t0:6.0f} s] interval {interval:g} s, mode {mode}: "
        f"{cfg.events} events at {plan.rate:g}/s ...",
        flush=True,
    )
    try:
        r = run_pipeline(cfg)
    except Exception as e:  # record and go on with the sweep
        print(f"    FAILED: {type(e).__name__}: {str(e)[:500]}", flush=True)
        return {"mode": mode, "trigger_s": interval, "error": f"{type(e).__name__}: {e}"}
    r.pop("anomalies", None)
    r.pop("kafka_end_offsets", None)
    lat = r["latency_ms"] or {}
    print(
        f"    {r['processing_rps']:,.0f} rows/s processing, p50 {lat.get('p50') or 0:,.0f} ms, "
        f"p99 {lat.get('p99') or 0:,.0f} ms, {r['batches']} batches, "
        f"dup {r['duplicates']} lost {r['lost']}",
        flush=True,
    )
    return r


def _sweep(plan: SweepPlan, t0: float) -> list[dict[str, Any]]:
    """Every (interval, mode) run on one embedded stack, started and stopped here."""
    from server_patches import stack as stack_mod

    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="chtx-sweep-") as tmp:
        info = stack_mod.start_stack(Path(tmp) / "stack", kafka=True)
        try:
            for interval in plan.intervals:
                for mode in plan.modes:
                    runs.append(_run_one(plan, info, Path(tmp) / "work", interval, mode, len(runs), t0))
        finally:
            stack_mod.stop_stack(Path(tmp) / "stack")
    return runs


def _document(plan: SweepPlan, runs: list[dict[str, Any]], t0: float) -> dict[str, Any]:
    """The JSON result: the configuration, every run and the overheads over ``none``."""
    return {
        "benchmark": "checkpoint_sweep",
        "quick": plan.quick,
        "config": {
            "intervals": plan.intervals,
            "modes": plan.modes,
            "rate": plan.rate,
            "partitions": plan.partitions,
            "base_duration_s": plan.base_s,
            "latency_poll_ms": 100,
            "spark": "local[2]",
            "machine": "2 cores, shared",
            "throughput": "rows / sum(triggerExecution) of data batches",
            "latency": "Kafka timestamp -> first read-committed poll showing the offset",
        },
        "runs": runs,
        "overheads": overheads([r for r in runs if "error" not in r]),
        "wall_s": round(time.monotonic() - t0, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sweep (the command line); write JSON and PNG. Exit 1 if any run failed."""
    plan = sweep_plan(argv)
    t0 = time.monotonic()
    runs = _sweep(plan, t0)
    doc = _document(plan, runs, t0)
    plan.json_path.parent.mkdir(parents=True, exist_ok=True)
    write_result(plan.json_path, doc)
    if any("error" not in r for r in runs):
        plot(doc, plan.png_path)
    print(f"wrote {plan.json_path} and {plan.png_path}")
    for o in doc["overheads"]:
        print(
            f"  interval {o['trigger_s']:>4g} s {o['mode']:<12} throughput overhead "
            f"{o['throughput_overhead_pct']:>6.1f}%  p50 latency +{o['p50_latency_overhead_ms']} ms"
        )
    return 0 if all("error" not in r for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
