"""The batch side of :mod:`benchmarks.streaming_speed`: topics, Spark's floor, batch reads and sinks."""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from benchmarks.streaming_speed_figures import FLOOR_BATCHES, batch_split
from spark_datasource.testing.streaming_job import DECODE_OPTIONS


def spark_floor(
    spark: Any, rows: int, work: Path, say: Callable[[str], None], batches: int = FLOOR_BATCHES
) -> dict[str, Any]:
    """Spark's own cost per micro-batch: ``rate-micro-batch`` (``rows`` rows over 8 partitions) → ``noop``.

    Driver, once per run (section 2), after the fixed-cost queries; ``benchmarks.checkpoint_fs``
    runs it once per variant and round, on a checkpoint under ``work``.
    """
    from benchmarks.batch_overhead import PARTITIONS, run_query

    progress = run_query(spark, "noop", "", "", rows, batches, work)
    out = {"records_per_batch": rows, "partitions": PARTITIONS, **batch_split(progress, skip_first=False)}
    say(f"Spark's floor: mean ms {out['mean_ms']}")
    return out


def _batch_read(spark: Any, bootstrap: str, topic: str, options: Mapping[str, str] | None = None) -> Any:
    """The whole topic as a batch ``kafka_py`` DataFrame (``options`` added to the source's)."""
    reader = spark.read.format("kafka_py").option("bootstrap.servers", bootstrap).option("subscribe", topic)
    return reader.options(**(options or {})).load()


def batch_seconds(spark: Any, bootstrap: str, topic: str) -> float:
    """One batch job: the whole topic through ``kafka_py`` into noop; its wall time."""
    t0 = time.monotonic()
    _batch_read(spark, bootstrap, topic).write.format("noop").mode("overwrite").save()
    return time.monotonic() - t0


def batch_sink_seconds(
    spark: Any, bootstrap: str, topic: str, url: str, mode: str, options: Mapping[str, str]
) -> float:
    """One batch job of the pipeline's events: the whole topic, its JSON decoded in the
    source, into a new ``clickhouse_tx`` target in ``mode``; its wall time (driver)."""
    from spark_datasource.testing.source_and_target import create_target
    from spark_datasource.testing.streaming_job import parse_events, target_options

    table = f"speed.batch_{mode}_{uuid.uuid4().hex[:8]}"
    create_target(url, table, mode)
    t0 = time.monotonic()  # from the reader on, as batch_seconds times the job into noop
    raw = _batch_read(spark, bootstrap, topic, {**DECODE_OPTIONS["source"], **options})
    writer = parse_events(raw).write.format("clickhouse_tx").option("url", url).options(**target_options(table, mode))
    writer.mode("append").save()
    return time.monotonic() - t0


def batch_noop(spark: Any, bootstrap: str, topic: str, rows: int) -> dict[str, Any]:
    """Batch ``kafka_py`` → noop twice; the second (warm) run is the ceiling."""
    runs = [batch_seconds(spark, bootstrap, topic) for _ in range(2)]
    return {"rows": rows, "seconds": [round(s, 2) for s in runs], "rows_per_s": round(rows / runs[-1], 1)}


def paced_batch(rate: float, partitions: int) -> int:
    """Records per partition of one 5 s trigger's batch at an offered ``rate`` (events/s)."""
    return max(4, int(rate * 5 / partitions))


def make_topics(
    bootstrap: str, control: str | None, a: argparse.Namespace, say: Callable[[str], None]
) -> dict[str, str]:
    """The section's topics: bulk-produced, a few records per batch, and paced at ``--rate``."""
    from spark_datasource.testing.source_and_target import create_topic, end_offsets, produce

    names = {kind: f"speed_{kind}_{uuid.uuid4().hex[:8]}" for kind in ("bulk", "small", "paced")}
    for name in names.values():
        create_topic(bootstrap, control, name, a.partitions)
    produce(bootstrap, names["bulk"], a.events, a.partitions)
    dropped = {p: lo for p, (lo, _) in end_offsets(bootstrap, names["bulk"], a.partitions)[names["bulk"]].items() if lo}
    if dropped:
        # The dev broker keeps ~5 MiB per partition and drops older batches like
        # retention: every later read of the bulk topic would fail on data loss.
        raise SystemExit(
            f"streaming_speed: the broker kept only part of {a.events:,} events over {a.partitions} partitions "
            f"(log start offsets {dropped}); the dev broker keeps ~5 MiB per partition: "
            f"use fewer --events or more --partitions"
        )
    produce(bootstrap, names["small"], 4 * a.partitions * a.fixed_batches, a.partitions)
    paced = 4 * a.partitions * paced_batch(a.rate, a.partitions)  # the range reads' 1 + 3 rounds
    say(f"producing {paced} events at {a.rate:g}/s to {names['paced']} ...")
    produce(bootstrap, names["paced"], paced, a.partitions, rate=a.rate)
    return names
