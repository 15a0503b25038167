"""The in-process streaming runs of :mod:`benchmarks.streaming_speed`: range reads, availableNow, noop rounds."""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.streaming_speed_batch import (
    batch_noop,
    batch_seconds,
    batch_sink_seconds,
    make_topics,
    paced_batch,
    spark_floor,
)
from benchmarks.streaming_speed_figures import BATCH_SINKS, SPLIT_RUNS, VARIANTS, batch_split
from spark_datasource import RECOMMENDED_SPARK_CONF
from spark_datasource.testing.streaming_job import DECODE_OPTIONS


def range_reads(
    bootstrap: str, topic: str, partitions: int, sizes: Sequence[int], rounds: int = 3, produced: str = "bulk"
) -> list[dict[str, Any]]:
    """ms per range read by :func:`read_range` in this process, fresh consumer vs pooled.

    "fresh" is the source before the pool (a consumer per range: connect, version
    probe, metadata, first fetch); "pooled" reads consecutive ranges of each
    partition as consecutive micro-batches do on a reused Python worker.
    """
    from spark_datasource.kafka.consumers import ConsumerPool
    from spark_datasource.kafka.fetch import read_range
    from spark_datasource.kafka.offsets import KafkaOffsetRange
    from spark_datasource.kafka.options import parse_kafka_options

    opts = parse_kafka_options({"bootstrap.servers": bootstrap, "subscribe": topic}, streaming=True)
    out = []
    for size in sizes:
        for kind in ("fresh", "pooled"):
            pool = ConsumerPool(idle_s=0.0 if kind == "fresh" else 60.0)
            times = []
            for r in range(rounds + 1):
                for p in range(partitions):
                    t = time.monotonic()
                    n = sum(
                        b.num_rows for b in read_range(opts, KafkaOffsetRange(topic, p, r * size, (r + 1) * size), pool)
                    )
                    if r and n == size:  # round 0 warms the pool (and this process)
                        times.append(1000 * (time.monotonic() - t))
            pool.close_all()
            out.append(
                {
                    "records": size,
                    "produced": produced,
                    "consumer": kind,
                    "reads": len(times),
                    "median_ms": round(statistics.median(times), 2) if times else None,
                }
            )
    return out


def _progress(q: Any) -> list[dict[str, Any]]:
    return [json.loads(p.json) for p in q.recentProgress]


def _run_stream(
    spark: Any,
    bootstrap: str,
    topic: str,
    max_per: int,
    sink: str,
    url: str | None,
    work: Path,
    source_options: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """One availableNow query from the earliest offset (``source_options`` added to
    ``kafka_py``'s); its progress and wall time."""
    from spark_datasource.testing.source_and_target import create_target
    from spark_datasource.testing.streaming_job import clickhouse_tx_writer, parse_events

    raw = (
        spark.readStream.format("kafka_py")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(max_per))
        .options(**(source_options or {}))
        .load()
    )
    chk = work / f"chk_{uuid.uuid4().hex[:8]}"
    if sink in ("noop", "parsed_noop", "parsed_noop_python"):
        # parsed_*: the pipeline's JSON parse, then Spark's JVM no-op sink or a Python
        # writer that only counts rows (the split of what the sink's stage costs)
        df = raw if sink == "noop" else parse_events(raw)
        fmt = "noop_python_stream" if sink == "parsed_noop_python" else "noop"
        w = df.writeStream.format(fmt).option("checkpointLocation", str(chk))
    else:
        table = f"speed.events_{sink}_{uuid.uuid4().hex[:8]}"
        create_target(str(url), table, sink)
        w = clickhouse_tx_writer(
            parse_events(raw),
            argparse.Namespace(
                url=url,
                table=table,
                mode=sink,
                query_name=f"speed_{sink}_{uuid.uuid4().hex[:6]}",
                checkpoint=str(chk),
                fault_step=None,
                writer_option=[],
            ),
        )
    t0 = time.monotonic()
    q = w.trigger(availableNow=True).start()
    q.awaitTermination()
    wall = time.monotonic() - t0
    prog = _progress(q)
    out = {
        "sink": sink,
        **({"source_options": dict(source_options)} if source_options else {}),
        "wall_s": round(wall, 2),
        **batch_split(prog),
        "all_batches": batch_split(prog, skip_first=False),
    }
    return out


def _attempt_seconds(run: Callable[[], float], rows: int) -> float | None:
    """Rows per second of a batch job that took ``run()`` seconds; None if it failed twice."""
    got = _attempt(lambda: {"seconds": run()}, {})
    return round(rows / got["seconds"], 1) if "seconds" in got else None


def _attempt(run: Callable[[], dict[str, Any]], label: Mapping[str, Any], tries: int = 2) -> dict[str, Any]:
    """``run()``, once more if it fails; a run that fails twice is recorded, not raised.

    On a loaded machine pyspark sometimes gives up on a Python worker that starts too
    slowly ("Python worker failed to connect back"); one lost query must not lose the
    rest of the benchmark.
    """
    for i in range(tries):
        try:
            return run()
        except Exception as e:  # recorded in the result
            if i + 1 == tries:
                return {**label, "error": f"{type(e).__name__}: {str(e)[:300]}"}
    raise AssertionError("unreachable")


def _with_cores(options: Mapping[str, str], cores: str) -> dict[str, str]:
    """``options`` with ``"cores"`` (in :data:`VARIANTS` and :data:`SPLIT_RUNS`) as the session's parallelism."""
    return {k: cores if v == "cores" else v for k, v in options.items()}


def _figures(run: Mapping[str, Any]) -> dict[str, Any]:
    """What the rounds keep of one availableNow run."""
    return {"rows_per_s": run.get("rows_per_s"), "add_batch_ms": (run.get("mean_ms") or {}).get("addBatch")}


def _median(xs: Sequence[float | None]) -> float | None:
    got = [x for x in xs if x]
    return round(statistics.median(got), 1) if got else None


def noop_rounds(
    spark: Any, bootstrap: str, url: str, topic: str, a: argparse.Namespace, work: Path, say: Callable[[str], None]
) -> dict[str, Any]:
    """Batch ``kafka_py`` → noop, then availableNow → noop under each of :data:`VARIANTS`
    and each of :data:`SPLIT_RUNS`, ``a.rounds`` times over, interleaved: the JVM
    warms up over the first runs and load comes in bursts, so every figure gets its
    share of both; the ratios use medians."""
    cores = str(spark.sparkContext.defaultParallelism)
    batch: list[float | None] = []
    batch_sinks: dict[str, list[float | None]] = {label: [] for label in BATCH_SINKS}
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in (*VARIANTS, *SPLIT_RUNS)}
    for i in range(a.rounds):
        batch.append(round(a.events / batch_seconds(spark, bootstrap, topic), 1))
        for label, (mode, sink_options) in BATCH_SINKS.items():
            cut = _with_cores(sink_options, cores)
            job = functools.partial(batch_sink_seconds, spark, bootstrap, topic, url, mode, cut)
            batch_sinks[label].append(_attempt_seconds(job, a.events))
        for label, (times, options) in VARIANTS.items():
            opts = _with_cores(options, cores)
            per = times * a.max_offsets
            run = functools.partial(_run_stream, spark, bootstrap, topic, per, "noop", None, work, opts)
            runs[label].append(_figures(_attempt(run, {"sink": "noop", "max_offsets": per, "source_options": opts})))
        for label, (sink, decode, times, options) in SPLIT_RUNS.items():
            opts = {**DECODE_OPTIONS[decode], **_with_cores(options, cores)}
            run = functools.partial(_run_stream, spark, bootstrap, topic, times * a.max_offsets, sink, url, work, opts)
            runs[label].append(_figures(_attempt(run, {"sink": sink, "source_options": opts})))
        say(f"noop round {i}: batch {batch[-1]:,.0f} rows/s, into clickhouse_tx {batch_sinks}, availableNow {runs}")
    streams = {label: [r["rows_per_s"] for r in runs[label]] for label in VARIANTS}
    split = {"noop": runs["default"], **{label: runs[label] for label in SPLIT_RUNS}}  # the raw read is "default"
    return {
        "rounds": a.rounds,
        "cores": int(cores),
        "batch_rows_per_s": batch,
        "batch_sink_rows_per_s": batch_sinks,
        "stream_rows_per_s": streams,
        "median": {"batch": _median(batch), **{label: _median(v) for label, v in streams.items()}},
        "batch_sink_median": {label: _median(v) for label, v in batch_sinks.items()},
        "split": split,
        "split_median": {
            sink: {k: _median([r[k] for r in rs]) for k in ("rows_per_s", "add_batch_ms")} for sink, rs in split.items()
        },
    }


def in_process(
    bootstrap: str, control: str | None, url: str, a: argparse.Namespace, work: Path, say: Callable[[str], None]
) -> dict[str, Any]:
    """Sections 1 and 2: ceiling, availableNow per sink (bulk and paced), the fixed cost per batch."""
    from benchmarks.batch_overhead import NoopStreamSource
    from spark_datasource.testing.streaming_job import build_session

    topics = make_topics(bootstrap, control, a, say)
    per_batch, paced_per = 4 * a.partitions, paced_batch(a.rate, a.partitions)
    reads = range_reads(bootstrap, topics["bulk"], a.partitions, (4, a.max_offsets // a.partitions // 4))
    reads += range_reads(bootstrap, topics["paced"], a.partitions, (paced_per,), produced="paced")
    say(f"range reads in-process: {reads}")
    spark = build_session(spark_conf=a.spark_conf)
    import spark_datasource

    spark_datasource.register(spark)
    spark.dataSource.register(NoopStreamSource)
    # what the session runs with, read back from it (the settings a run compares)
    spark_conf = {k: spark.conf.get(k) for k in {**RECOMMENDED_SPARK_CONF, **a.spark_conf}}
    try:
        batch = batch_noop(spark, bootstrap, topics["bulk"], a.events)
        say(f"batch kafka_py -> noop: {batch['rows_per_s']:,.0f} rows/s")

        def each_sink(source: str, max_per: int, what: str, sinks: Sequence[str] = ("noop", *a.modes)) -> list[dict]:
            """One availableNow query from ``source`` into each of ``sinks``."""
            runs = []
            for sink in sinks:
                opts = {} if sink == "noop" else DECODE_OPTIONS[a.decode]  # noop reads the raw records
                run = functools.partial(_run_stream, spark, bootstrap, source, max_per, sink, url, work, opts)
                runs.append(_attempt(run, {"sink": sink}))
                r = runs[-1]
                say(
                    f"{what} {sink}: {r.get('rows_per_s') or 0:,.0f} rows/s over {r.get('batches')} batches, "
                    f"mean ms {r.get('mean_ms')} {r.get('error', '')}"
                )
            return runs

        avail = each_sink(topics["bulk"], a.max_offsets, "availableNow")
        rounds = noop_rounds(spark, bootstrap, url, topics["bulk"], a, work, say)
        one = each_sink(topics["bulk"], a.events, "availableNow, the whole topic in one batch,", ("noop",))
        paced = each_sink(topics["paced"], paced_per * a.partitions, "availableNow over paced records,")
        fixed = each_sink(topics["small"], per_batch, f"fixed cost ({per_batch}-record batches)")
        floor = _attempt(functools.partial(spark_floor, spark, per_batch, work, say), {})
    finally:
        spark.stop()
    return {
        "spark_conf": spark_conf,
        "range_reads": reads,
        "batch_noop": batch,
        "available_now": avail,
        "noop_rounds": rounds,
        "available_now_one_batch": one,
        "available_now_paced": {"records_per_batch": paced_per * a.partitions, "rate": a.rate, "by_sink": paced},
        "fixed_cost": {"records_per_batch": per_batch, "partitions": a.partitions, "by_sink": fixed},
        "spark_floor": floor,
    }
