"""The figures of one pipeline run: counts, verification, latency, batches; the summary table."""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence, cast

from clickhouse_tx.client.sql import qualified, split_table
from clickhouse_tx.verify.verifier import ClickHouseReader, verify
from spark_datasource.testing.credentials import target_fields
from spark_datasource.testing.job_launcher import JobLauncher
from spark_datasource.testing.pipeline_config import PipelineRun
from spark_datasource.testing.source_and_target import end_offsets
from spark_datasource.testing.visibility import VisibilityPoller, latencies_ms, percentile


def figures(r: PipelineRun, launcher: JobLauncher, poller: VisibilityPoller | None) -> dict:
    """Verify the table against Kafka and the produced ids; the run's figures, ``ok`` last."""
    cfg = r.cfg
    wall = time.monotonic() - r.t_start
    job_wall = sum(((j.ended or time.monotonic()) - j.started) for j in launcher.runs)
    batches = [p for j in launcher.runs for p in j.progress if p.get("rows")]
    lat = latencies_ms(r.url, r.table, poller.samples, r.latency_since) if poller else []
    result = {
        "mode": cfg.mode,
        "trigger_s": cfg.trigger,
        "events": cfg.events,
        "partitions": cfg.partitions,
        "produced": r.produced,
        **record_check(r.url, r.table, r.bootstrap, r.topic, cfg.partitions, cfg.events),
        "crashes_planned": len(r.crashes),
        "crashes": len(r.crashes_done),
        "crash_log": r.crashes_done,
        "failures": r.failures,
        "restarts": len(launcher.runs) - 1,
        "job_runs": len(launcher.runs),
        **batch_figures(batches, cfg.events, job_wall),
        "steady": batch_figures([p for p in batches if (p.get("wall") or 0) >= (r.latency_since or 0)], 0, 0)
        if cfg.warmup_s
        else None,
        "warmup_s": cfg.warmup_s,
        "wall_s": round(wall, 2),
        "rate": cfg.rate,
        "latency_ms": {
            "p50": percentile(lat, 50),
            "p99": percentile(lat, 99),
            "max": max(lat) if lat else None,
            "records": len(lat),
            "poll_interval_ms": cfg.latency_poll_s * 1000,
        }
        if poller
        else None,
        "table": r.table,
        "topic": r.topic,
    }
    result["ok"] = (
        result["lost"] == 0 and result["lost_event_ids"] == 0 and (cfg.mode == "none" or result["duplicates"] == 0)
    )
    return result


def record_check(url: str, table: str, bootstrap: str, topic: str, partitions: int, events: int) -> dict[str, Any]:
    """Every record of ``topic`` in ``table`` exactly once? The check of every pipeline run.

    The (topic, partition, offset) set in the table, read committed, against Kafka's
    offsets 0..end of each partition (:func:`clickhouse_tx.verify.verifier.verify`), and the
    distinct event ids against the ``events`` produced. Whatever wrote the table (the
    streaming job, a ``foreachBatch`` sink, ClickHouse's Kafka engine) is checked the
    same way. Calling process, once per run, after the writing stopped.
    """
    kafka_offsets = end_offsets(bootstrap, topic, partitions)
    expected = {topic: {p: [0, hi] for p, (lo, hi) in kafka_offsets[topic].items()}}
    report = verify(
        url,
        table,
        expected={(topic, int(p)): (0, hi) for p, (lo, hi) in kafka_offsets[topic].items()},
        markers=False,
        **target_fields(),
    )
    ch = ClickHouseReader(url, **target_fields())
    try:
        ev = ch.rows(f"SELECT uniqExact(event_id) AS u FROM {qualified(*split_table(table))}")[0]
    finally:
        ch.close()
    return {
        "kafka_end_offsets": expected,
        "rows_in_clickhouse": report.rows,
        "distinct_offsets": report.distinct,
        "distinct_event_ids": int(ev["u"]),
        "duplicates": report.duplicates,
        "lost": report.missing,
        "lost_event_ids": events - int(ev["u"]) if report.rows else events,
        "anomalies": [a.to_json() for a in report.anomalies[:50]],
    }


def batch_figures(batches: Sequence[dict], events: int, job_wall: float) -> dict:
    """Throughput and per-batch means from the job's PROGRESS lines (replays included).

    ``steady_rps`` leaves out the first micro-batch, whose time includes starting Spark's
    Python workers and their imports (``first_batch_ms``): the rate a running query keeps.
    """
    proc_s = sum((p.get("trigger_ms") or 0) for p in batches) / 1000.0
    rows_all = sum(int(p.get("rows") or 0) for p in batches)
    warm_s = sum((p.get("trigger_ms") or 0) for p in batches[1:]) / 1000.0
    return {
        "first_batch_ms": batches[0].get("trigger_ms") if batches else None,
        "steady_rps": round(sum(int(p.get("rows") or 0) for p in batches[1:]) / warm_s, 1) if warm_s else None,
        "batches": len(batches),
        "rows_processed_incl_replays": rows_all,
        "job_wall_s": round(job_wall, 2),
        "throughput_rps": round(events / job_wall, 1) if job_wall else None,
        "processing_rps": round(rows_all / proc_s, 1) if proc_s else None,
        "mean_batch_ms": round(1000 * proc_s / len(batches), 1) if batches else None,
        "mean_write_commit_ms": round(sum((p.get("add_batch_ms") or 0) for p in batches) / len(batches), 1)
        if batches
        else None,
    }


def summary_table(r: Mapping[str, object]) -> str:
    """The human summary of one run."""
    rows = [
        ("mode", r["mode"]),
        ("trigger", f"{r['trigger_s']} s"),
        ("events produced", r["produced"]),
        ("rows in ClickHouse", r["rows_in_clickhouse"]),
        ("distinct offsets", r["distinct_offsets"]),
        ("duplicates", r["duplicates"]),
        ("lost", r["lost"]),
        ("lost event ids", r["lost_event_ids"]),
        ("crashes (SIGKILL)", f"{r['crashes']} of {r['crashes_planned']} planned"),
        ("restarts", r["restarts"]),
        ("micro-batches", r["batches"]),
        ("wall time", f"{r['wall_s']} s (job {r['job_wall_s']} s)"),
        ("throughput", f"{r['throughput_rps']:,} events/s end to end" if r["throughput_rps"] else "-"),
        ("processing rate", f"{r['processing_rps']:,} rows/s in batches" if r["processing_rps"] else "-"),
        ("mean write+commit", f"{r['mean_write_commit_ms']} ms per batch"),
    ]
    if r.get("latency_ms"):
        lat = cast("dict[str, Any]", r["latency_ms"])
        rows.append(("latency p50/p99", f"{lat['p50']:.0f} / {lat['p99']:.0f} ms" if lat["p50"] is not None else "-"))
    w = max(len(k) for k, _ in rows)
    line = "+" + "-" * (w + 2) + "+" + "-" * 40 + "+"
    body = [line] + [f"| {k:<{w}} | {str(v):<38} |" for k, v in rows] + [line]
    verdict = (
        "EXACTLY ONCE: duplicates=0 lost=0"
        if r["duplicates"] == 0 and r["lost"] == 0
        else (
            f"duplicates={r['duplicates']} lost={r['lost']}" + (" (at-least-once mode)" if r["mode"] == "none" else "")
        )
    )
    return "\n".join(body + [verdict])
