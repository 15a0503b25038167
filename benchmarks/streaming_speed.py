"""Streaming at the speed of the source: ``kafka_py`` batch vs streaming vs each sink mode.

``python -m benchmarks.streaming_speed [--quick]`` runs, on one embedded stack:

1. **Ceiling and availableNow** (one in-process ``local[2]`` SparkSession, one topic
   produced up front): batch ``kafka_py`` → ``noop`` (the source's ceiling, the second
   of two runs), streaming ``kafka_py`` → ``noop``, and streaming → ``clickhouse_tx``
   in each mode (the JSON decoded as ``--decode`` says), all with
   ``Trigger.AvailableNow`` and ``maxOffsetsPerTrigger``.
   Streaming throughput is rows / Σ ``triggerExecution`` of the batches after the
   first (the first one pays the Python workers' start); the per-batch split is the
   mean of each ``StreamingQueryProgress.durationMs`` entry over those batches.
   Then **noop rounds**: the batch job and availableNow → noop under each cut and
   batch size of :data:`VARIANTS`, and the pipeline's job cut at each stage of
   :data:`SPLIT_RUNS` (raw read, JSON parse by ``from_json`` or by the source, Python
   writer, ``none``, ``transaction``), ``--rounds`` times interleaved; the
   streaming/batch ratios are the medians' (the JVM warms up over the first runs).
   Each round also runs the pipeline's events (the JSON decoded in the source) as a
   batch job into ``clickhouse_tx`` as :data:`BATCH_SINKS` says: what the sink costs
   with no micro-batches at all on this machine, where ClickHouse and the broker share
   the cores with Spark. Each decoded streaming run is also given over the batch job
   into the same mode with the same cut (``stream decoded_transaction/batch transaction``).
   Beside them: ``noop`` with the whole topic in one batch (how the ratio to the
   batch job depends on the batch size), and **paced production**: a second topic
   produced at ``--rate`` (as the pipeline runs produce), read by the same range reads
   and availableNow queries with batches of one 5 s trigger. The dev broker (librdkafka's
   mock cluster) answers each Fetch with one producer batch per partition, so records
   produced a few at a time cost one round trip per few records (``docs/performance.md``).
2. **Fixed cost**: a streaming query over batches of a few records per partition
   (8 partitions), into ``noop`` and into ``clickhouse_tx`` in each mode: its mean
   ``triggerExecution`` (after the first batch) is what a micro-batch costs whatever
   its size. Beside it, **Spark's floor**: Spark's ``rate-micro-batch`` source (the
   same records per batch and partitions) into ``noop``, what any micro-batch of this
   session costs before a source or sink adds anything (``--spark-conf
   spark.sql.streaming.checkpointFileManagerClass=...`` measures it, and everything
   else, with another checkpoint file manager: ``docs/performance.md``).
3. **Triggers and latency**: :func:`spark_datasource.testing.pipeline.run_pipeline` (the streaming job
   in its own process, a producer offering a steady ``--rate``) per mode and trigger
   interval: processing rate and end-to-end latency p50/p99, Kafka timestamp → visible
   to a read-committed reader (the pipeline's :class:`~spark_datasource.testing.visibility.VisibilityPoller`),
   over what is produced after a warm-up of :data:`WARMUP_S` (the first batches with
   data start the Python workers; the whole run's figures are kept beside).
4. **Ramp**: per mode at a 1 s trigger, offered rates doubling from ``--ramp-start``
   until a batch takes longer than the trigger (the lag then grows without bound, or
   the job fails when the dev broker drops records it has not read: ~5 MiB per partition);
   the last rate that kept up is the mode's sustained maximum. Then ``transaction`` at
   half its maximum, for the latency at a comfortable load.

Every session runs with :data:`spark_datasource.RECOMMENDED_SPARK_CONF` (Python workers
on Unix domain sockets); ``--spark-conf KEY=VALUE`` changes the session of sections 1
and 2 (``spark.python.unix.domain.socket.enabled=false`` measures without it).

Ratios (streaming/batch, transaction/none) are computed within the run. Writes JSON to
``benchmarks/results/streaming_speed[_quick].json`` and a PNG beside it.
"""

from __future__ import annotations

import argparse
import functools
import json
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.results_file import machine, write_result
from spark_datasource import RECOMMENDED_SPARK_CONF
from spark_datasource.testing.streaming_job import DECODE_OPTIONS, DEFAULT_DECODE

MODES = ("none", "transaction", "staging", "dedup")
TRIGGERS = (0.5, 1.0, 5.0, 10.0)
RESULTS = Path(__file__).resolve().parent / "results"
#: Seconds of each pipeline run before what it measures: the first micro-batches with
#: data start Python workers (imports, Kafka consumers, ClickHouse connections).
WARMUP_S = 10.0

#: Micro-batches measured by the floor query (after batch_overhead's warm-up batches).
FLOOR_BATCHES = 10

#: durationMs entries Spark reports for a micro-batch, in the order they happen.
SPLIT_KEYS = ("latestOffset", "getBatch", "queryPlanning", "walCommit", "addBatch", "commitOffsets", "triggerExecution")


# ------------------------------------------------------------------ pure pieces


def batch_split(progress: Sequence[Mapping[str, Any]], skip_first: bool = True) -> dict[str, Any]:
    """Throughput and mean ``durationMs`` per entry over the batches that read rows.

    ``skip_first`` leaves out the first such batch (Python worker start, imports).
    """
    batches = [p for p in progress if p.get("numInputRows")]
    if skip_first and len(batches) > 1:
        batches = batches[1:]
    if not batches:
        return {"batches": 0, "rows": 0, "rows_per_s": None, "mean_ms": {}}
    rows = sum(int(p["numInputRows"]) for p in batches)
    trig = sum(float((p.get("durationMs") or {}).get("triggerExecution") or 0) for p in batches)
    mean = {
        k: round(statistics.fmean(float((p.get("durationMs") or {}).get(k) or 0) for p in batches), 1)
        for k in SPLIT_KEYS
    }
    return {
        "batches": len(batches),
        "rows": rows,
        "rows_per_s": round(1000 * rows / trig, 1) if trig else None,
        "mean_ms": mean,
    }


def _div(a: float | None, b: float | None) -> float | None:
    """``a / b`` to 3 places, or None when either is missing (a run that failed)."""
    return round(a / b, 3) if a and b else None


def ratios(doc: Mapping[str, Any]) -> dict[str, float | None]:
    """The ratios the issue asks for, from one run's figures (None when a part is missing)."""
    # The noop rounds' medians, when the run has them; else its one run of each.
    rounds = (doc.get("noop_rounds") or {}).get("median") or {}
    ceiling = rounds.get("batch") or (doc.get("batch_noop") or {}).get("rows_per_s")
    avail = {r["sink"]: r.get("rows_per_s") for r in doc.get("available_now", [])}
    split = {k: v.get("rows_per_s") for k, v in ((doc.get("noop_rounds") or {}).get("split_median") or {}).items()}
    out: dict[str, float | None] = {
        "stream_noop/batch_noop": _div(rounds.get("default") or avail.get("noop"), ceiling),
        # the job as it runs by default: the JSON decoded in the source
        "stream_transaction/batch_noop": _div(split.get("decoded_transaction") or avail.get("transaction"), ceiling),
        "available_now transaction/none": _div(avail.get("transaction"), avail.get("none")),
    }
    for label in split:
        if label not in ("noop", "decoded_transaction") and split.get(label):
            out[f"stream {label}/batch_noop"] = _div(split.get(label), ceiling)
    if split.get("transaction"):
        out["split transaction/none"] = _div(split.get("transaction"), split.get("none"))
    if split.get("decoded_transaction"):
        decoded = (split.get("decoded_transaction"), split.get("decoded_none"))
        out["split decoded_transaction/decoded_none"] = _div(*decoded)
    for label in (c for c in rounds if c not in ("batch", "default")):
        out[f"stream_noop {label}/batch_noop"] = _div(rounds.get(label), ceiling)
    batch_sinks = (doc.get("noop_rounds") or {}).get("batch_sink_median") or {}
    out.update(_sink_ceiling_ratios(batch_sinks, split, ceiling))
    one = {r["sink"]: r.get("rows_per_s") for r in doc.get("available_now_one_batch", [])}
    out["stream_noop one batch/batch_noop"] = _div(one.get("noop"), ceiling)
    paced = {r["sink"]: r.get("rows_per_s") for r in (doc.get("available_now_paced") or {}).get("by_sink", [])}
    for sink in ("noop", "transaction"):
        out[f"available_now {sink} paced/bulk"] = _div(paced.get(sink), avail.get(sink))
    for mode in ("staging", "dedup"):
        out[f"available_now {mode}/none"] = _div(avail.get(mode), avail.get("none"))
    fixed_runs = (doc.get("fixed_cost") or {}).get("by_sink", [])
    fixed = {r["sink"]: (r.get("mean_ms") or {}).get("triggerExecution") for r in fixed_runs}
    floor = (doc.get("spark_floor") or {}).get("mean_ms") or {}
    out["fixed_cost noop/spark_floor"] = _div(fixed.get("noop"), floor.get("triggerExecution"))
    by = {(r["mode"], r["trigger_s"]): steady(r).get("processing_rps") for r in doc.get("triggers", [])}
    for trig in sorted({t for _, t in by}):
        out[f"trigger {trig:g}s transaction/none"] = _div(by.get(("transaction", trig)), by.get(("none", trig)))
    return out


def _sink_ceiling_ratios(
    batch_sinks: Mapping[str, float | None], split: Mapping[str, float | None], ceiling: float | None
) -> dict[str, float | None]:
    """The batch jobs into ``clickhouse_tx`` over the batch job into noop, and each
    streaming run of the decoded job over the batch job into the same mode with the
    same ``kafka_py`` options."""
    out: dict[str, float | None] = {}
    for label, (mode, options) in BATCH_SINKS.items():
        batch_sink = batch_sinks.get(label)
        if not batch_sink:
            continue
        out[f"batch {label}/batch_noop"] = _div(batch_sink, ceiling)
        for run, (sink, decode, _, run_options) in SPLIT_RUNS.items():
            if (sink, decode, run_options) == (mode, "source", options) and split.get(run):
                out[f"stream {run}/batch {label}"] = _div(split.get(run), batch_sink)
    return out


def steady(run: Mapping[str, Any]) -> Mapping[str, Any]:
    """A pipeline run's batch figures after its warm-up (the whole run's when it had none)."""
    return run.get("steady") or run


def kept_up(run: Mapping[str, Any], trigger_s: float) -> bool:
    """A run at an offered rate kept up: every record arrived, batches after the warm-up fit in the trigger."""
    mean = steady(run).get("mean_batch_ms")
    return bool(run.get("ok")) and mean is not None and mean <= 1000 * trigger_s


def ramp(
    measure: Callable[[float], Mapping[str, Any]], start: float, steps: int, trigger_s: float
) -> tuple[float | None, list[dict[str, Any]]]:
    """Double the offered rate from ``start`` until a run does not keep up (at most ``steps``).

    Returns the highest rate that kept up (None if the first did not) and every run.
    """
    best: float | None = None
    runs: list[dict[str, Any]] = []
    rate = start
    for _ in range(steps):
        r = dict(measure(rate))
        r["kept_up"] = kept_up(r, trigger_s)
        runs.append(r)
        if not r["kept_up"]:
            break
        best = rate
        rate *= 2
    return best, runs


# ------------------------------------------------------------------ in-process runs


def range_reads(
    bootstrap: str, topic: str, partitions: int, sizes: Sequence[int], rounds: int = 3, produced: str = "bulk"
) -> list[dict[str, Any]]:
    """ms per range read by :func:`read_range` in this process, fresh consumer vs pooled.

    "fresh" is the source before the pool (a consumer per range: connect, version
    probe, metadata, first fetch); "pooled" reads consecutive ranges of each
    partition as consecutive micro-batches do on a reused Python worker.
    """
    from spark_datasource.kafka_options import parse_kafka_options
    from spark_datasource.kafka_reader import ConsumerPool, KafkaOffsetRange, read_range

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


def _batch_seconds(spark: Any, bootstrap: str, topic: str) -> float:
    """One batch job: the whole topic through ``kafka_py`` into noop; its wall time."""
    t0 = time.monotonic()
    _batch_read(spark, bootstrap, topic).write.format("noop").mode("overwrite").save()
    return time.monotonic() - t0


def _batch_sink_seconds(
    spark: Any, bootstrap: str, topic: str, url: str, mode: str, options: Mapping[str, str]
) -> float:
    """One batch job of the pipeline's events: the whole topic, its JSON decoded in the
    source, into a new ``clickhouse_tx`` target in ``mode``; its wall time (driver)."""
    from spark_datasource.testing.source_and_target import create_target
    from spark_datasource.testing.streaming_job import parse_events, target_options

    table = f"speed.batch_{mode}_{uuid.uuid4().hex[:8]}"
    create_target(url, table, mode)
    t0 = time.monotonic()  # from the reader on, as _batch_seconds times the job into noop
    raw = _batch_read(spark, bootstrap, topic, {**DECODE_OPTIONS["source"], **options})
    writer = parse_events(raw).write.format("clickhouse_tx").option("url", url).options(**target_options(table, mode))
    writer.mode("append").save()
    return time.monotonic() - t0


def _batch_noop(spark: Any, bootstrap: str, topic: str, rows: int) -> dict[str, Any]:
    """Batch ``kafka_py`` → noop twice; the second (warm) run is the ceiling."""
    runs = [_batch_seconds(spark, bootstrap, topic) for _ in range(2)]
    return {"rows": rows, "seconds": [round(s, 2) for s in runs], "rows_per_s": round(rows / runs[-1], 1)}


def paced_batch(rate: float, partitions: int) -> int:
    """Records per partition of one 5 s trigger's batch at an offered ``rate`` (events/s)."""
    return max(4, int(rate * 5 / partitions))


def _topics(bootstrap: str, control: str | None, a: argparse.Namespace, say: Callable[[str], None]) -> dict[str, str]:
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


#: The noop rounds' streaming variants: label → (``maxOffsetsPerTrigger`` as a multiple of
#: ``--max-offsets``, ``kafka_py`` options; ``"cores"`` stands for the session's default
#: parallelism). ``minRecordsPerPartition`` 1 is Spark's own cut (a task per Kafka
#: partition) and 2000 the default before 2026-11-25; the larger batches, cut into one
#: task per core, show what Spark's per-batch checkpoint writes and pyspark's per-task
#: cost leave of the batch job's rate once a batch holds more records.
VARIANTS: dict[str, tuple[int, dict[str, str]]] = {
    "default": (1, {}),
    "minRecordsPerPartition=1": (1, {"minRecordsPerPartition": "1"}),
    "minRecordsPerPartition=2000": (1, {"minRecordsPerPartition": "2000"}),
    "2x maxOffsetsPerTrigger": (2, {}),
    "2x maxOffsetsPerTrigger, maxPartitions=cores": (2, {"maxPartitions": "cores"}),
    "4x maxOffsetsPerTrigger, maxPartitions=cores": (4, {"maxPartitions": "cores"}),
}


#: The batch jobs each noop round runs beside the batch ``kafka_py`` → noop: the
#: pipeline's events, JSON decoded in the source, into ``clickhouse_tx``: label → (mode,
#: more ``kafka_py`` options). They are what the streaming runs into the same sink and
#: cut can reach on this machine, where ClickHouse, the broker and Spark share the cores.
BATCH_SINKS: dict[str, tuple[str, dict[str, str]]] = {
    "none": ("none", {}),
    "transaction": ("transaction", {}),
    "transaction, maxPartitions=cores": ("transaction", {"maxPartitions": "cores"}),
}


#: The split of a micro-batch into the stages of the pipeline's job, one availableNow
#: query each per noop round after the raw read (the "default" variant): label → (sink,
#: where the JSON is decoded (``streaming_job.DECODE_OPTIONS``), ``maxOffsetsPerTrigger``
#: as a multiple of ``--max-offsets``, more ``kafka_py`` options). With ``from_json``:
#: the parse (Spark's JVM no-op sink), the hop of the rows to a Python writer that
#: counts them, the sink in two modes. Then the same job with the JSON decoded in the
#: source, and that job in batches of four times the records, one task per core.
SPLIT_RUNS: dict[str, tuple[str, str, int, dict[str, str]]] = {
    "parsed_noop": ("parsed_noop", "spark", 1, {}),
    "parsed_noop_python": ("parsed_noop_python", "spark", 1, {}),
    "none": ("none", "spark", 1, {}),
    "transaction": ("transaction", "spark", 1, {}),
    "decoded_noop": ("parsed_noop", "source", 1, {}),
    "decoded_none": ("none", "source", 1, {}),
    "decoded_transaction": ("transaction", "source", 1, {}),
    "decoded_transaction, 4x maxOffsetsPerTrigger, maxPartitions=cores": (
        "transaction",
        "source",
        4,
        {"maxPartitions": "cores"},
    ),
}


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
        batch.append(round(a.events / _batch_seconds(spark, bootstrap, topic), 1))
        for label, (mode, sink_options) in BATCH_SINKS.items():
            cut = _with_cores(sink_options, cores)
            job = functools.partial(_batch_sink_seconds, spark, bootstrap, topic, url, mode, cut)
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

    topics = _topics(bootstrap, control, a, say)
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
        batch = _batch_noop(spark, bootstrap, topics["bulk"], a.events)
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


# ------------------------------------------------------------------ pipeline runs


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


# ------------------------------------------------------------------ output


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
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _key_value(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` of ``--spark-conf``."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"takes KEY=VALUE, got {text!r}")
    return key, value


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.streaming_speed", description=(__doc__ or "").split("\n")[0]
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a few minutes: fewer events, triggers 1 and 5 s, modes none and transaction",
    )
    ap.add_argument(
        "--events",
        type=int,
        default=None,
        help="default 400000 (the dev broker keeps ~5 MiB, ~60k events, a partition), quick 150000",
    )
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--max-offsets", type=int, default=50_000, help="maxOffsetsPerTrigger")
    ap.add_argument("--fixed-batches", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3, help="noop rounds (batch vs availableNow by variant)")
    ap.add_argument("--modes", default=None, help="default none,transaction,staging,dedup")
    ap.add_argument("--triggers", default=None, help="seconds, default 0.5,1,5,10 (quick 1,5)")
    ap.add_argument("--rate", type=float, default=2000.0, help="offered events/s for the trigger runs")
    ap.add_argument("--duration", type=float, default=None, help="seconds per run (default 30, quick 15)")
    ap.add_argument("--ramp-modes", default=None, help="default none,transaction")
    ap.add_argument("--ramp-start", type=float, default=2000.0)
    ap.add_argument("--ramp-steps", type=int, default=None, help="default 6, quick 3")
    ap.add_argument(
        "--decode",
        default=DEFAULT_DECODE,
        choices=tuple(DECODE_OPTIONS),
        help="where the job decodes the JSON in sections 1-4 (the split runs both)",
    )
    ap.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        type=_key_value,
        metavar="KEY=VALUE",
        help="a Spark setting for the session of sections 1 and 2 (repeatable), e.g. "
        "spark.python.unix.domain.socket.enabled=false to measure without the recommended one",
    )
    ap.add_argument("--skip-pipeline", action="store_true", help="sections 1 and 2 only")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    a.spark_conf = dict(a.spark_conf)
    a.events = a.events or (150_000 if a.quick else 400_000)
    a.modes = [m for m in (a.modes or ("none,transaction" if a.quick else ",".join(MODES))).split(",") if m]
    a.triggers = [float(t) for t in (a.triggers or ("1,5" if a.quick else "0.5,1,5,10")).split(",")]
    a.duration = a.duration or (15.0 if a.quick else 30.0)
    a.ramp_modes = [m for m in (a.ramp_modes or "none,transaction").split(",") if m]
    a.ramp_steps = a.ramp_steps or (3 if a.quick else 6)
    return a


def _save(doc: dict[str, Any], a: argparse.Namespace, jpath: Path, t0: float) -> None:
    """Write what has been measured so far (after every section: a long run cut short
    still leaves its figures)."""
    doc["config"] = {
        "events": a.events,
        "partitions": a.partitions,
        "max_offsets_per_trigger": a.max_offsets,
        "noop_rounds": a.rounds,
        "modes": a.modes,
        "triggers": a.triggers,
        "rate": a.rate,
        "duration_s": a.duration,
        "ramp_modes": a.ramp_modes,
        "ramp_start": a.ramp_start,
        "quick": a.quick,
        "decode": a.decode,
        "spark": "local[2]",
        "machine": machine(),
    }
    doc["ratios"] = ratios(doc)
    doc["wall_s"] = round(time.monotonic() - t0, 1)
    write_result(jpath, doc)
    plot(doc, jpath.with_suffix(".png"))


def main(argv: Sequence[str] | None = None) -> int:
    a = _parse(argv)
    name = "streaming_speed_quick" if a.quick else "streaming_speed"
    jpath = Path(a.json) if a.json else RESULTS / f"{name}.json"
    t0 = time.monotonic()
    # A SIGTERM (a timeout) unwinds like an exception, so the stack below is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    def say(s: str) -> None:
        print(f"[{time.monotonic() - t0:6.0f} s] {s}", flush=True)

    from server_patches import stack as stack_mod

    with tempfile.TemporaryDirectory(prefix="chtx-speed-") as tmp:
        work = Path(tmp)
        info = stack_mod.start_stack(work / "stack", kafka=True)
        try:
            doc: dict[str, Any] = in_process(
                str(info.kafka_bootstrap), info.kafka_control, info.clickhouse_url, a, work, say
            )
            _save(doc, a, jpath, t0)
            if not a.skip_pipeline:
                pipeline_sections(doc, info, a, work, say, lambda: _save(doc, a, jpath, t0))
        finally:
            stack_mod.stop_stack(work / "stack")
    _save(doc, a, jpath, t0)
    print(f"wrote {jpath} and {jpath.with_suffix('.png')}")
    for k, v in doc["ratios"].items():
        print(f"  {k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
