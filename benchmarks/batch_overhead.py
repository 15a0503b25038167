"""Benchmark: the ``clickhouse_tx`` sink's fixed cost per micro-batch, each mode vs no-op sinks.

The stream costs (almost) nothing to produce: Spark's ``rate-micro-batch`` source,
8 partitions and ``--rows`` rows per micro-batch (default 80), trigger
``processingTime=0`` (batches back to back), ``--batches`` micro-batches per sink
after 3 warm-up batches. Sinks: ``noop`` (Spark's JVM no-op sink), ``noop_python``
(a Python ``DataSourceStreamArrowWriter`` that only counts rows: the cost of Spark's
Python data source machinery itself), ``foreach_connect`` (``foreachBatch`` with
``toArrow()`` and clickhouse-connect's ``insert_arrow``, the peer (b) of
:mod:`benchmarks.peers`, which runs in the driver's own Python and needs none of that
machinery), ``foreach_tx`` (``foreachBatch`` with the exactly-once helper
``clickhouse_tx_batch``) and ``clickhouse_tx`` in modes ``none``, ``transaction``,
``staging`` and ``dedup``. One session runs every sink in turn, so each starts with Spark's Python
workers already up: what is compared is the cost of a micro-batch once a query runs.

Per sink: the median and p90 of ``triggerExecution``, ``addBatch`` (the write and the
driver's commit) and ``commitOffsets`` from ``StreamingQueryProgress.durationMs``, and
``ratios`` (micro-batches per second of each mode over ``noop_python`` and ``none``).
With ``--trace`` every ClickHouse HTTP request of the writer is recorded
(:mod:`benchmarks.http_trace`): requests per micro-batch by role (driver, executor)
and statement kind, and their summed time.

    python -m benchmarks.batch_overhead                 # starts its own stack
    python -m benchmarks.batch_overhead --trace --batches 20
    python -m benchmarks.batch_overhead --rows 50000 --sinks noop_python,foreach_connect,transaction

Writes ``benchmarks/results/batch_overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from spark_datasource.testing.session import local_session

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from benchmarks import http_trace
from benchmarks.bench_session import run_micro_batches
from benchmarks.results_file import machine, write_result
from benchmarks.spark_write import run_sql
from spark_datasource.testing.foreach_sinks import foreach_batch

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "batch_overhead.json"
MODES = ("none", "transaction", "staging", "dedup")
#: The peer without Spark's Python sink: ``foreachBatch`` + clickhouse-connect.
FOREACH = "foreach_connect"
#: ``foreachBatch`` with the exactly-once helper ``clickhouse_tx_batch``.
FOREACH_TX = "foreach_tx"
#: The sinks that write rows into a table (each run checks their count).
TABLE_SINKS = (*MODES, FOREACH, FOREACH_TX)
SINKS = ("noop", "noop_python", *TABLE_SINKS)
WARMUP = 3
PARTITIONS = 8


class _Count(WriterCommitMessage):
    def __init__(self, rows: int) -> None:
        self.rows = rows


class NoopStreamWriter(DataSourceStreamArrowWriter):
    """Executor: count the rows; driver: nothing (the cost of the Python machinery)."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _Count:
        return _Count(sum(b.num_rows for b in iterator))

    def commit(self, messages, batchId) -> None:
        pass

    def abort(self, messages, batchId) -> None:
        pass


class NoopStreamSource(DataSource):
    """``format("noop_python_stream")``."""

    @classmethod
    def name(cls) -> str:
        return "noop_python_stream"

    def streamWriter(self, schema, overwrite: bool) -> NoopStreamWriter:
        return NoopStreamWriter()


def _trace_dir() -> Path:
    """A directory with a ``sitecustomize.py`` that installs the HTTP trace in every worker."""
    d = Path(tempfile.mkdtemp(prefix="bench_trace_"))
    (d / "sitecustomize.py").write_text("from benchmarks import http_trace\nhttp_trace.install()\n")
    return d


def _spark(trace: Path | None):
    import spark_datasource

    if trace is not None:
        paths = [str(_trace_dir()), str(ROOT), os.environ.get("PYTHONPATH", "")]
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        os.environ[http_trace.ENV] = str(trace)
    conf = {
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        "spark.driver.memory": "1g",
    }
    spark = local_session("clickhouse-tx-batch-overhead", conf)
    spark_datasource.register(spark)
    spark.dataSource.register(NoopStreamSource)
    return spark


def _stream(spark, rows: int):
    return (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", rows)
        .option("numPartitions", PARTITIONS)
        .load()
        .selectExpr("value AS id", "cast(value % 1000 AS int) AS k", "cast(value AS double) * 0.5 AS v")
    )


def _with_sink(writer, sink: str, url: str, db: str):  # (DataStreamWriter, ...) -> DataStreamWriter
    """``writer`` into ``sink``; the sinks of :data:`TABLE_SINKS` get a fresh ``db.<sink>``."""
    if sink == "noop":
        return writer.format("noop")
    if sink == "noop_python":
        return writer.format("noop_python_stream")
    settings = " SETTINGS non_replicated_deduplication_window = 1000" if sink == "dedup" else ""
    run_sql(url, f"CREATE TABLE {db}.{sink} (id Int64, k Int32, v Float64) ENGINE = MergeTree ORDER BY id{settings}")
    if sink in (FOREACH, FOREACH_TX):
        return writer.foreachBatch(foreach_batch(sink, url, f"{db}.{sink}", None, None, None))
    return (
        writer.format("clickhouse_tx")
        .option("url", url)
        .option("database", db)
        .option("table", sink)
        .option("mode", sink)
        .option("allow_nullable_into_non_nullable", "true")
    )


def run_query(spark, sink: str, url: str, db: str, rows: int, batches: int, workdir: Path) -> list[dict]:
    """Run one sink for WARMUP + ``batches`` micro-batches; the measured progress records."""
    writer = _stream(spark, rows).writeStream.trigger(processingTime="0 seconds")
    writer = writer.option("checkpointLocation", f"file://{workdir}/{sink}_{uuid.uuid4().hex[:6]}")
    writer = _with_sink(writer, sink, url, db)
    progress = run_micro_batches(writer.start(), batches + WARMUP, 60 + 10 * (batches + WARMUP), sink)
    measured = progress[WARMUP : WARMUP + batches]
    if sink in TABLE_SINKS:
        got = int(run_sql(url, f"SELECT count() FROM {db}.{sink} SETTINGS implicit_transaction = 1").strip())
        want = sum(p["numInputRows"] for p in progress)
        if got < want:  # batches past the last reported progress may have committed too
            raise RuntimeError(f"{sink}: {got} rows in the table, the progress reports {want}")
    return measured


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median": statistics.median(ordered),
        "p90": ordered[int(0.9 * (len(ordered) - 1))],
        "min": ordered[0],
        "max": ordered[-1],
    }


def _summary(progress: list[dict]) -> dict[str, Any]:
    durations = {
        k: _stats([float(p["durationMs"].get(k, 0)) for p in progress])
        for k in ("triggerExecution", "addBatch", "commitOffsets", "walCommit", "queryPlanning", "latestOffset")
    }
    wall = time.mktime(time.strptime(progress[-1]["timestamp"][:19], "%Y-%m-%dT%H:%M:%S")) - time.mktime(
        time.strptime(progress[0]["timestamp"][:19], "%Y-%m-%dT%H:%M:%S")
    )
    return {
        "batches": len(progress),
        "durations_ms": durations,
        "batches_per_s": 1000.0 / durations["triggerExecution"]["median"],
        "rows_per_batch": progress[0]["numInputRows"],
        "wall_s_between_first_and_last": wall,
    }


def run(url: str, rows: int, batches: int, sinks: list[str], trace: bool) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="bench_overhead_"))
    trace_file = workdir / "http_trace.jsonl" if trace else None
    spark = _spark(trace_file)
    db = f"bench_{uuid.uuid4().hex[:8]}"
    run_sql(url, f"CREATE DATABASE {db}")
    results: dict[str, Any] = {}
    try:
        for sink in sinks:
            start = time.time()
            progress = run_query(spark, sink, url, db, rows, batches, workdir)
            results[sink] = _summary(progress)
            if trace_file is not None:
                first = progress[0]["batchId"]
                last = progress[-1]["batchId"]
                lines = [x for x in http_trace.read(trace_file) if x["t"] >= start]
                # only requests of the measured batches: between the first measured batch's start
                # and the end of the last one
                t0 = _epoch(progress[0]["timestamp"])
                t1 = _epoch(progress[-1]["timestamp"]) + progress[-1]["durationMs"]["triggerExecution"] / 1000
                lines = [x for x in lines if t0 <= x["t"] <= t1]
                results[sink]["http"] = http_trace.per_batch(lines, last - first + 1)
            med = results[sink]["durations_ms"]
            print(
                f"{sink}: triggerExecution {med['triggerExecution']['median']:.0f} ms, "
                f"addBatch {med['addBatch']['median']:.0f} ms (median of {len(progress)})",
                flush=True,
            )
    finally:
        run_sql(url, f"DROP DATABASE IF EXISTS {db} SYNC")
        spark.stop()
    return _report(results, rows, batches, trace)


def _epoch(stamp: str) -> float:
    import datetime

    return datetime.datetime.fromisoformat(stamp).timestamp()


def _report(results: dict[str, Any], rows: int, batches: int, trace: bool) -> dict[str, Any]:
    ratios: dict[str, float] = {}
    for mode in (*MODES, "noop_python", FOREACH_TX):
        if mode not in results:
            continue
        for base in ("noop_python", "none", FOREACH):
            if base in results and base != mode:
                ratios[f"{mode}_over_{base}"] = results[mode]["batches_per_s"] / results[base]["batches_per_s"]
    fixed = {
        m: results[m]["durations_ms"]["triggerExecution"]["median"]
        - results["noop_python"]["durations_ms"]["triggerExecution"]["median"]
        for m in MODES
        if m in results and "noop_python" in results
    }
    return {
        "benchmark": "batch_overhead",
        "rows_per_batch": rows,
        "partitions": PARTITIONS,
        "measured_batches": batches,
        "warmup_batches": WARMUP,
        "trigger": "processingTime=0",
        "master": "local[2]",
        "traced": trace,
        "results": results,
        "ratios": ratios,
        "sink_fixed_cost_ms_over_noop_python": fixed,
        "targets": {"fixed_cost_ms": 300},
        "targets_met": {f"{m}_fixed_cost_ms": v < 300 for m, v in fixed.items()},
        "machine": machine(),
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=80, help="rows per micro-batch")
    ap.add_argument("--batches", type=int, default=20, help="measured micro-batches per sink")
    ap.add_argument("--sinks", default="noop,noop_python," + ",".join(MODES))
    ap.add_argument("--trace", action="store_true", help="record every ClickHouse HTTP request")
    ap.add_argument("--url", help="ClickHouse HTTP url (default: start a private stack)")
    ap.add_argument("--out", default=str(RESULT))
    a = ap.parse_args(argv)
    sinks = [s for s in a.sinks.split(",") if s]
    if unknown := [s for s in sinks if s not in SINKS]:
        ap.error(f"--sinks: {', '.join(unknown)} unknown; the sinks are {', '.join(SINKS)}")
    if a.url:
        report = run(a.url, a.rows, a.batches, sinks, a.trace)
    else:
        from server_patches.stack import start_stack, stop_stack

        d = Path(tempfile.mkdtemp(prefix="bench_stack_"))
        try:
            report = run(start_stack(d).clickhouse_url, a.rows, a.batches, sinks, a.trace)
        finally:
            stop_stack(d, purge=True)
    write_result(a.out, report)
    print(json.dumps({"ratios": report["ratios"], "fixed_ms": report["sink_fixed_cost_ms_over_noop_python"]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
