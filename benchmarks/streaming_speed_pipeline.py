"""The pipeline sections of :mod:`benchmarks.streaming_speed`: triggers, latency and the ramp, each a harness run."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from benchmarks.streaming_speed_figures import WARMUP_S, ramp, steady


def _pipeline_run(
    info: Any, work: Path, mode: str, trigger: float, rate: float, duration: float, seed: int, decode: str
) -> dict[str, Any]:
    from benchmarks.checkpoint_sweep import run_duration
    from spark_datasource.testing.pipeline import run_pipeline
    from spark_datasource.testing.pipeline_config import PipelineConfig

    dur = run_duration(trigger, duration) + WARMUP_S
    cfg = PipelineConfig(
        events=int(rate * dur),
        warmup_s=WARMUP_S,
        partitions=8,
        mode=mode,
        trigger=trigger,
        crashes=0,
        rate=rate,
        url=info.clickhouse_url,
        bootstrap=str(info.kafka_bootstrap),
        kafka_control=info.kafka_control,
        work_dir=str(work / "pipeline"),
        measure_latency=True,
        quiet=True,
        seed=seed,
        decode=decode,
    )
    try:
        r = run_pipeline(cfg)
    except Exception as e:  # record and go on with the benchmark
        err = f"{type(e).__name__}: {str(e)[:400]}"
        if "KafkaDataLossError" in str(e):
            # The job fell so far behind that the dev broker (~5 MiB per partition)
            # dropped records it had not read: the source refused to skip them.
            err = f"fell behind until the broker dropped unread records (data loss refused); {err}"
        return {"mode": mode, "trigger_s": trigger, "rate": rate, "ok": False, "error": err}
    for k in ("anomalies", "kafka_end_offsets", "crash_log"):
        r.pop(k, None)
    return r


def _fmt_run(r: Mapping[str, Any]) -> str:
    if "error" in r:
        return f"FAILED {r['error'][:200]}"
    lat = r.get("latency_ms") or {}
    return (
        f"{steady(r).get('processing_rps') or 0:,.0f} rows/s, mean batch {steady(r).get('mean_batch_ms')} ms, "
        f"p50 {lat.get('p50') or 0:,.0f} ms, p99 {lat.get('p99') or 0:,.0f} ms, "
        f"dup {r.get('duplicates')} lost {r.get('lost')}"
    )


def pipeline_sections(
    doc: dict[str, Any],
    info: Any,
    a: argparse.Namespace,
    work: Path,
    say: Callable[[str], None],
    save: Callable[[], None],
) -> None:
    """Sections 3 and 4 into ``doc``: each mode per trigger at ``--rate``, then the ramp."""
    runs: list[dict[str, Any]] = []
    ramps: dict[str, Any] = {}
    doc.update({"triggers": runs, "ramp": ramps, "transaction_at_half_max": None})
    for trig in a.triggers:
        for mode in a.modes:
            r = _pipeline_run(info, work, mode, trig, a.rate, a.duration, len(runs), a.decode)
            runs.append(r)
            say(f"trigger {trig:g} s {mode}: {_fmt_run(r)}")
            save()
    for mode in a.ramp_modes:

        def measure(rate: float, mode: str = mode) -> Mapping[str, Any]:
            r = _pipeline_run(info, work, mode, 1.0, rate, a.duration, 1000 + len(runs), a.decode)
            say(f"ramp {mode} at {rate:g}/s: {_fmt_run(r)}")
            return r

        best, steps = ramp(measure, a.ramp_start, a.ramp_steps, 1.0)
        ramps[mode] = {"max_sustained_rate": best, "runs": steps}
        save()
    best_tx = (ramps.get("transaction") or {}).get("max_sustained_rate")
    if best_tx:
        half = _pipeline_run(info, work, "transaction", 1.0, best_tx / 2, a.duration, 9999, a.decode)
        doc["transaction_at_half_max"] = half
        say(f"transaction at half its maximum ({best_tx / 2:g}/s), 1 s trigger: {_fmt_run(half)}")
