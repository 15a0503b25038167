"""The streaming job: Kafka (``kafka_py``) → parse JSON → ClickHouse (``clickhouse_tx``).

A Spark driver program, run as its own process (``python -m spark_datasource.testing.streaming_job``),
usually by :mod:`spark_datasource.testing.pipeline`, which kills and restarts it. It stops by itself
once the query has committed everything up to ``--end-offsets`` (or, with
``--trigger 0``, when ``Trigger.AvailableNow`` has drained the topic).

Output protocol (stdout, one line each, for the parent to parse):

- ``PROGRESS {json}``: one per finished micro-batch: batch id, rows, rates, durations;
- ``DONE {json}``: the query reached the end offsets and stopped cleanly.

Everything else (Spark's own logging) goes to stderr.

Where code runs: this module is the driver; the data sources' hooks run in Spark's
Python workers (see :mod:`spark_datasource.sink.writer` and :mod:`spark_datasource.kafka.reader`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Mapping, Sequence

from spark_datasource.testing import credentials
from spark_datasource.testing.foreach_sinks import FOREACH_FAULT_STEP, SINKS, foreach_batch
from spark_datasource.testing.session import local_session

#: The JSON each event carries (see :func:`spark_datasource.testing.source_and_target.event_json`).
EVENT_SCHEMA = "event_id LONG, user_id LONG, amount DOUBLE, ts LONG"

#: ``--decode``: where the events' JSON is decoded. ``source``: by ``kafka_py``
#: (``value.format=json``), Arrow's JSON reader on the executors; ``spark``: Spark's
#: ``from_json`` on the raw value, as a job on Spark's own Kafka source does.
DECODE_OPTIONS: dict[str, dict[str, str]] = {
    "source": {"value.format": "json", "value.schema": EVENT_SCHEMA},
    "spark": {},
}
DEFAULT_DECODE = "source"

#: Columns of the target table, in the order the job writes them.
TABLE_COLUMNS = (
    ("event_id", "Int64"),
    ("user_id", "Int64"),
    ("amount", "Float64"),
    ("event_time", "DateTime64(6, 'UTC')"),
    ("topic", "String"),
    ("partition", "Int32"),
    ("offset", "Int64"),
    ("kafka_ts", "DateTime64(6, 'UTC')"),
)


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m spark_datasource.testing.streaming_job", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--url", required=True, help="ClickHouse HTTP url (unused when --writer-option gives shards)")
    ap.add_argument("--table", required=True, help="database.table (created by the pipeline)")
    ap.add_argument("--mode", default="transaction", choices=("transaction", "staging", "dedup", "none"))
    ap.add_argument("--checkpoint", required=True, help="checkpointLocation")
    ap.add_argument("--query-name", default="events_to_clickhouse")
    ap.add_argument(
        "--trigger", type=float, default=1.0, help="processingTime trigger interval, seconds; 0 = Trigger.AvailableNow"
    )
    ap.add_argument("--max-offsets-per-trigger", type=int, default=None)
    ap.add_argument(
        "--end-offsets", default=None, help='stop once the sink committed up to these offsets: {"topic": {"0": end}}'
    )
    ap.add_argument("--starting-offsets", default="earliest")
    ap.add_argument(
        "--decode",
        default=DEFAULT_DECODE,
        choices=tuple(DECODE_OPTIONS),
        help="where the JSON is decoded (DECODE_OPTIONS)",
    )
    ap.add_argument(
        "--fault-step",
        default=None,
        help=f"fault.step of the writer (tests and the demo); {FOREACH_FAULT_STEP} for a foreachBatch sink",
    )
    ap.add_argument("--fault-action", default="kill")
    ap.add_argument("--fault-once-file", default=None)
    ap.add_argument("--fault-batch", default=None)
    ap.add_argument(
        "--writer-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra clickhouse_tx option (repeatable)",
    )
    ap.add_argument(
        "--source-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra kafka_py option, e.g. maxPartitions=2 (repeatable)",
    )
    ap.add_argument(
        "--sink",
        default="clickhouse_tx",
        choices=SINKS,
        help="foreach_insert: a diagnostic at-least-once sink (foreachBatch + plain "
        "INSERT over HTTP) that bypasses the clickhouse_tx writer; foreach_connect: "
        "foreachBatch + clickhouse-connect insert_arrow, at least once",
    )
    ap.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting of the job's session, over RECOMMENDED_SPARK_CONF (repeatable)",
    )
    ap.add_argument("--shuffle-partitions", type=int, default=2)
    ap.add_argument("--master", default="local[2]", help="e.g. local[2,4]: a failed task is tried up to 4 times")
    ap.add_argument("--timeout", type=float, default=None, help="give up after this many seconds (exit 3)")
    return ap.parse_args(argv)


def build_session(master: str = "local[2]", spark_conf: Mapping[str, str] | None = None):  # -> SparkSession
    """``local[2]`` (or ``master``) session, UI off, this interpreter on the workers (driver, once).

    ``spark_conf`` is added last (``streaming_speed --spark-conf``: a Spark setting's worth,
    e.g. :data:`spark_datasource.RECOMMENDED_SPARK_CONF`'s, measured against its absence).
    """
    # fault.action=kill must take the whole driver (Python and JVM), not only the
    # pyspark worker daemon's own process group (see clickhouse_tx.testing.faults).
    os.environ["CLICKHOUSE_TX_KILL_PGID"] = str(os.getpgrp())
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    conf = {
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.driver.memory": "1g",
        "spark.pyspark.python": sys.executable,
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        **(spark_conf or {}),
    }
    return local_session("clickhouse-tx-pipeline", conf, master)


def reached(end_offsets: Mapping[str, Mapping[str, int]], committed: Mapping[str, Mapping[str, int]] | None) -> bool:
    """True when ``committed`` (a source offset JSON) is at or past every end offset."""
    if not committed:
        return all(int(v) == 0 for parts in end_offsets.values() for v in parts.values())
    for topic, parts in end_offsets.items():
        have = {str(k): int(v) for k, v in (committed.get(topic) or {}).items()}
        if any(have.get(str(p), -1) < int(end) for p, end in parts.items()):
            return False
    return True


def _as_dict(p: Any) -> dict[str, Any]:
    """A StreamingQueryProgress (pyspark 4: an object with ``.json``) or a dict, as a dict."""
    if isinstance(p, dict):
        return p
    return json.loads(p.json)


def _idle(q: Any) -> bool:
    """The query is up and waiting (Spark reports no progress for idle triggers at first)."""
    try:
        st = q.status
    except Exception:  # not started yet
        return False
    return not st.get("isTriggerActive") and str(st.get("message", "")).startswith("Waiting for")


def _emit(kind: str, doc: Mapping[str, object]) -> None:
    sys.stdout.write(f"{kind} {json.dumps(doc, sort_keys=True)}\n")
    sys.stdout.flush()


def progress_line(p: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a ``StreamingQueryProgress`` the pipeline shows and records."""
    src = (p.get("sources") or [{}])[0]
    dur = p.get("durationMs") or {}
    end = src.get("endOffset")
    if isinstance(end, str):
        end = json.loads(end)
    return {
        "batch": p.get("batchId"),
        "rows": p.get("numInputRows"),
        "input_rps": p.get("inputRowsPerSecond"),
        "processed_rps": p.get("processedRowsPerSecond"),
        "add_batch_ms": dur.get("addBatch"),
        "trigger_ms": dur.get("triggerExecution"),
        "wal_commit_ms": dur.get("walCommit"),
        "timestamp": p.get("timestamp"),
        "end_offset": end,
        "wall": time.time(),
    }


def parse_events(raw):  # (DataFrame) -> DataFrame
    """The events of ``kafka_py`` rows, in :data:`TABLE_COLUMNS` order (driver, once per query).

    ``value`` is parsed with ``from_json``, or taken as it is when the source already
    decoded it (:data:`DECODE_OPTIONS`).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    decoded = isinstance(raw.schema["value"].dataType, StructType)
    ev = F.col("value") if decoded else F.from_json(F.col("value").cast("string"), EVENT_SCHEMA)
    return raw.select(
        ev.event_id.alias("event_id"),
        ev.user_id.alias("user_id"),
        ev.amount.alias("amount"),
        F.timestamp_millis(ev.ts).alias("event_time"),
        F.col("topic"),
        F.col("partition"),
        F.col("offset"),
        F.col("timestamp").alias("kafka_ts"),
    )


def target_options(table: str, mode: str) -> dict[str, str]:
    """The ``clickhouse_tx`` options of the job's target, streaming or batch (driver)."""
    # from_json and the Kafka columns are nullable in Spark's schema; the events
    # always carry every field, so the non-Nullable table columns are kept
    return {"table": table, "mode": mode, "allow_nullable_into_non_nullable": "true"}


def key_values(flag: str, given: Sequence[str]) -> dict[str, str]:
    """``KEY=VALUE`` arguments of a repeatable ``flag`` as options (the jobs' and benchmarks'
    ``--writer-option``, ``--source-option``, ``--spark-conf``)."""
    out = {}
    for kv in given:
        k, eq, v = kv.partition("=")
        if not eq or not k:
            raise SystemExit(f"{flag} {kv!r}: expected KEY=VALUE")
        out[k] = v
    return out


def clickhouse_tx_writer(df, a: argparse.Namespace):  # -> DataStreamWriter
    w = (
        df.writeStream.format("clickhouse_tx")
        .queryName(a.query_name)
        .options(**target_options(a.table, a.mode))
        .option("checkpointLocation", a.checkpoint)
    )
    if a.fault_step:
        w = w.option("fault.step", a.fault_step).option("fault.action", a.fault_action)
        if a.fault_once_file:
            w = w.option("fault.once_file", a.fault_once_file)
        if a.fault_batch is not None:
            w = w.option("fault.batch", str(a.fault_batch))
    extra = key_values("--writer-option", a.writer_option)
    # a cluster's writer names its shards instead of one url
    # the run's user and password (make test-external) first, so the options given win
    where = {} if "shards" in extra else {"url": a.url}
    return w.options(**{**credentials.writer_options(), **where, **extra})


def run(argv: Sequence[str] | None = None) -> int:
    """Start the query, report progress, stop at the end offsets. Returns the exit code."""
    a = _args(argv)
    end_offsets = json.loads(a.end_offsets) if a.end_offsets else None
    spark = build_session(a.master, key_values("--spark-conf", a.spark_conf))
    import spark_datasource

    spark_datasource.register(spark)
    reader = (
        spark.readStream.format("kafka_py")
        .option("bootstrap.servers", a.bootstrap)
        .option("subscribe", a.topic)
        .option("startingOffsets", a.starting_offsets)
        .options(**DECODE_OPTIONS[a.decode])
        .options(**key_values("--source-option", a.source_option))
    )
    if a.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(a.max_offsets_per_trigger))
    df = parse_events(reader.load())
    if a.sink != "clickhouse_tx":
        w = (
            df.writeStream.queryName(a.query_name)
            .foreachBatch(foreach_batch(a.sink, a.url, a.table, a.fault_step, a.fault_batch, a.fault_once_file))
            .option("checkpointLocation", a.checkpoint)
        )
    else:
        w = clickhouse_tx_writer(df, a)
    w = w.trigger(availableNow=True) if a.trigger <= 0 else w.trigger(processingTime=f"{a.trigger} seconds")
    started = time.monotonic()
    q = w.start()
    seen: set[int] = set()
    ready = False
    rc = 0
    try:
        while True:
            done = bool(q.awaitTermination(0.25))
            recent = [_as_dict(p) for p in q.recentProgress]
            if not ready and (recent or _idle(q)):
                ready = True
                _emit("READY", {"seconds": round(time.monotonic() - started, 3)})
            for p in recent:
                # idle triggers repeat the last batch id with no rows: report real batches once
                if not p.get("numInputRows") or p.get("batchId") in seen:
                    continue
                seen.add(p["batchId"])
                _emit("PROGRESS", progress_line(p))
            committed = None
            if recent and recent[-1].get("sources"):
                committed = recent[-1]["sources"][0].get("endOffset")
                if isinstance(committed, str):
                    committed = json.loads(committed)
            if end_offsets is not None and reached(end_offsets, committed):
                break
            if done or not q.isActive:
                exc = q.exception()
                if exc is not None:
                    print(f"query failed: {exc}", file=sys.stderr)
                    rc = 1
                break
            if a.timeout and time.monotonic() - started > a.timeout:
                print(f"timed out after {a.timeout:.0f} s", file=sys.stderr)
                rc = 3
                break
    finally:
        if q.isActive:
            q.stop()
        spark.stop()
    if rc == 0:
        _emit("DONE", {"batches": len(seen), "seconds": round(time.monotonic() - started, 3)})
    return rc


if __name__ == "__main__":
    sys.exit(run())
