"""Benchmark: the same Spark job into ``clickhouse_tx`` in each mode vs a no-op Python Arrow writer.

The job: ``spark.range(rows)`` with 3 columns (Int64 id, Int32 k, Float64 v), local[2],
one Spark partition per core, appended to a fresh MergeTree table. The no-op writer is
a trivial ``DataSourceArrowWriter`` that counts rows: the ceiling of any Python writer
here. ``none`` is the at-least-once baseline (plain INSERT).

Ratios reported: ``transaction / none`` (target >= 0.9), ``staging / none`` (>= 0.8),
``dedup / none`` (>= 0.9) and ``none / noop`` (>= 0.6). Each of ``--repeat`` rounds runs
every configuration once, interleaved; ``ratios`` compare the best runs and
``ratio_spread_per_round`` gives min/median/max of the ratio within each round.

    python -m benchmarks.spark_write --rows 20000000        # starts its own stack
    python -m benchmarks.spark_write --url http://127.0.0.1:8123 --rows 1000000

Writes ``benchmarks/results/spark_write.json``.

``--publish`` runs a third comparison: the batch job in mode ``transaction`` published
at once through its job stage (``visibility=auto``, the default) vs partition by
partition (``visibility=partition``); ratio ``auto / partition`` (target >= 0.9).
Writes ``benchmarks/results/spark_write_publish.json``.

    python -m benchmarks.spark_write --publish --rows 20000000 --repeat 3

``--typed`` runs the other comparison instead: the 3-column job (Int64 id, timestamp
ts, double v) in mode ``transaction`` into a table whose column types differ from
Spark's (``UInt64``, ``DateTime``, ``Float32``: every value converted and checked on
the executors) vs into one that matches them (``Int64``, ``DateTime64(6, 'UTC')``,
``Float64``); ratio ``typed / matching`` (target >= 0.9). Writes
``benchmarks/results/spark_write_typed.json``.

    python -m benchmarks.spark_write --typed --rows 20000000 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import requests
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

from benchmarks.results_file import machine, write_result
from spark_datasource.testing.session import local_session

# Read when the SparkSession starts its Python workers, not at import.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "spark_write.json"
RESULT_TYPED = ROOT / "benchmarks" / "results" / "spark_write_typed.json"
RESULT_PUBLISH = ROOT / "benchmarks" / "results" / "spark_write_publish.json"
#: --publish: configuration -> the writer's visibility (mode transaction).
PUBLISH_VISIBILITY = {"partition": "partition", "auto": "auto"}
#: --typed: table -> column types; the Spark frame is (id long, ts timestamp, v double).
TYPED_TABLES = {
    "matching": "(id Int64, ts DateTime64(6, 'UTC'), v Float64)",
    "typed": "(id UInt64, ts DateTime, v Float32)",
}
MODES = ("none", "transaction", "staging", "dedup")


class _Count(WriterCommitMessage):
    def __init__(self, rows: int) -> None:
        self.rows = rows


class NoopArrowWriter(DataSourceArrowWriter):
    """Executor: consume the Arrow batches and count rows; driver: nothing."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _Count:
        return _Count(sum(b.num_rows for b in iterator))

    def commit(self, messages) -> None:
        pass

    def abort(self, messages) -> None:
        pass


class NoopDataSource(DataSource):
    """``format("noop_arrow")``: the ceiling of a Python Arrow writer."""

    @classmethod
    def name(cls) -> str:
        return "noop_arrow"

    def writer(self, schema, overwrite: bool) -> NoopArrowWriter:
        return NoopArrowWriter()


def run_sql(url: str, text: str) -> str:
    r = requests.post(url, data=text.encode(), timeout=600)
    if r.status_code != 200:
        raise RuntimeError(f"{text!r}: {r.text.strip()}")
    return r.text


def bench_frame(spark, rows: int):
    """The benchmark's rows (id, k, v) over 2 Spark partitions; shared with ``benchmarks.shard_write``."""
    return spark.range(0, rows, 1, 2).selectExpr("id", "cast(id % 1000 as int) as k", "cast(id as double) * 0.5 as v")


def _typed_frame(spark, rows: int):
    return spark.range(0, rows, 1, 2).selectExpr(
        "id", "timestamp_micros(1700000000000000 + id * 1000001) as ts", "cast(id as double) * 0.5 as v"
    )


def bench_session():
    """The benchmark's local SparkSession with the data sources and ``noop_arrow`` registered."""
    import spark_datasource

    spark = local_session("clickhouse-tx-bench", {"spark.driver.memory": "2g"})
    spark_datasource.register(spark)
    spark.dataSource.register(NoopDataSource)
    return spark


def run_typed(url: str, rows: int, repeat: int) -> dict[str, Any]:
    """The same job into a table of other column types vs one matching Spark's (transaction)."""
    spark = bench_session()
    db = f"bench_{uuid.uuid4().hex[:8]}"
    run_sql(url, f"CREATE DATABASE {db}")
    results: dict[str, dict[str, Any]] = {}
    try:
        _typed_frame(spark, 100_000).write.format("noop_arrow").mode("append").save()  # warm-up
        for i in range(repeat):
            for name, columns in TYPED_TABLES.items():  # interleaved: same conditions for both
                table = f"{name}_{i}"
                run_sql(url, f"CREATE TABLE {db}.{table} {columns} ENGINE = MergeTree ORDER BY id")
                t = time.perf_counter()
                (
                    _typed_frame(spark, rows)
                    .write.format("clickhouse_tx")
                    .option("url", url)
                    .option("database", db)
                    .option("table", table)
                    .mode("append")
                    .save()
                )
                elapsed = time.perf_counter() - t
                got = run_sql(
                    url,
                    f"SELECT count(), max(id), toUnixTimestamp(max(ts)) FROM {db}.{table} "
                    "SETTINGS implicit_transaction = 1 FORMAT TSV",
                ).split()
                last_s = (1700000000000000 + (rows - 1) * 1000001) // 1_000_000
                if [int(x) for x in got] != [rows, rows - 1, last_s]:
                    raise RuntimeError(f"{name}: table holds {got}, expected {[rows, rows - 1, last_s]}")
                run_sql(url, f"DROP TABLE {db}.{table} SYNC")
                best = min(results.get(name, {}).get("seconds", 1e9), elapsed)
                results[name] = {"seconds": best, "rows_per_s": rows / best, "columns": columns}
                print(f"{name} {columns}: {rows / elapsed:,.0f} rows/s", flush=True)
    finally:
        run_sql(url, f"DROP DATABASE IF EXISTS {db} SYNC")
        spark.stop()
    ratio = results["typed"]["rows_per_s"] / results["matching"]["rows_per_s"]
    return {
        "benchmark": "spark_write_typed",
        "mode": "transaction",
        "rows": rows,
        "columns": 3,
        "master": "local[2]",
        "spark_partitions": 2,
        "repeat": repeat,
        "spark_types": "id long, ts timestamp, v double",
        "results": results,
        "ratios": {"typed_over_matching": ratio},
        "targets": {"typed_over_matching": 0.9},
        "targets_met": {"typed_over_matching": ratio >= 0.9},
        "machine": machine(),
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _timed_write(spark, url: str, db: str, mode: str, table: str, rows: int, **options: str) -> float:
    """One job into a fresh table in ``mode`` (``noop``: the no-op writer); seconds, checked.

    ``options``: more writer options (``visibility``)."""
    if mode == "noop":
        t = time.perf_counter()
        bench_frame(spark, rows).write.format("noop_arrow").mode("append").save()
        return time.perf_counter() - t
    settings = " SETTINGS non_replicated_deduplication_window = 1000" if mode == "dedup" else ""
    run_sql(url, f"CREATE TABLE {db}.{table} (id Int64, k Int32, v Float64) ENGINE = MergeTree ORDER BY id{settings}")
    t = time.perf_counter()
    (
        bench_frame(spark, rows)
        .write.format("clickhouse_tx")
        .option("url", url)
        .option("database", db)
        .option("table", table)
        .option("mode", mode)
        .option("allow_nullable_into_non_nullable", "true")
        .options(**options)
        .mode("append")
        .save()
    )
    elapsed = time.perf_counter() - t
    got = int(run_sql(url, f"SELECT count() FROM {db}.{table} SETTINGS implicit_transaction = 1").strip())
    if got != rows:
        raise RuntimeError(f"mode {mode}: {got} rows in the table, expected {rows}")
    run_sql(url, f"DROP TABLE {db}.{table} SYNC")
    return elapsed


def _spread(runs: dict[str, list[float]], mode: str, base: str) -> dict[str, float]:
    """``mode / base`` throughput per repeat (same round, so same machine load): min, median, max."""
    per_round = sorted(runs[base][i] / runs[mode][i] for i in range(len(runs[mode])))
    return {"min": per_round[0], "median": per_round[len(per_round) // 2], "max": per_round[-1]}


def _interleaved_runs(url: str, rows: int, repeat: int, configs: dict[str, tuple[str, dict[str, str]]]) -> dict:
    """Seconds of each configuration (name -> (mode, writer options)) per round, rounds interleaved,
    so a burst of load from other processes hits one round rather than one configuration."""
    spark = bench_session()
    db = f"bench_{uuid.uuid4().hex[:8]}"
    run_sql(url, f"CREATE DATABASE {db}")
    runs: dict[str, list[float]] = {name: [] for name in configs}
    try:
        bench_frame(spark, 100_000).write.format("noop_arrow").mode("append").save()  # warm-up
        for i in range(repeat):
            for name, (mode, options) in configs.items():
                elapsed = _timed_write(spark, url, db, mode, f"{name}_{i}", rows, **options)
                runs[name].append(elapsed)
                print(f"round {i} {name}: {rows / elapsed:,.0f} rows/s ({elapsed:.2f} s)", flush=True)
    finally:
        run_sql(url, f"DROP DATABASE IF EXISTS {db} SYNC")
        spark.stop()
    return runs


def run(url: str, rows: int, repeat: int) -> dict:
    """Each repeat runs every mode once, interleaved (noop, none, transaction, staging, dedup)."""
    runs = _interleaved_runs(url, rows, repeat, {m: (m, {}) for m in ("noop", *MODES)})
    results = {m: {"seconds": min(s), "rows_per_s": rows / min(s), "all_seconds": s} for m, s in runs.items()}
    best: dict[str, float] = {m: rows / min(s) for m, s in runs.items()}
    ratios = {
        "transaction_over_none": best["transaction"] / best["none"],
        "staging_over_none": best["staging"] / best["none"],
        "dedup_over_none": best["dedup"] / best["none"],
        "none_over_noop": best["none"] / best["noop"],
    }
    spread = {f"{m}_over_none": _spread(runs, m, "none") for m in ("transaction", "staging", "dedup")}
    spread["none_over_noop"] = _spread(runs, "none", "noop")
    targets = {"transaction_over_none": 0.9, "staging_over_none": 0.8, "dedup_over_none": 0.9, "none_over_noop": 0.6}
    return {
        "benchmark": "spark_write",
        "rows": rows,
        "columns": 3,
        "master": "local[2]",
        "spark_partitions": 2,
        "repeat": repeat,
        "results": results,
        "ratios": ratios,
        "ratio_spread_per_round": spread,
        "targets": targets,
        "targets_met": {k: ratios[k] >= v for k, v in targets.items()},
        "machine": machine(),
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def run_publish(url: str, rows: int, repeat: int) -> dict[str, Any]:
    """Mode ``transaction``, published at once (``auto``) vs per partition; rounds interleaved."""
    configs = {name: ("transaction", {"visibility": v}) for name, v in PUBLISH_VISIBILITY.items()}
    runs = _interleaved_runs(url, rows, repeat, configs)
    results = {m: {"seconds": min(s), "rows_per_s": rows / min(s), "all_seconds": s} for m, s in runs.items()}
    ratio = min(runs["partition"]) / min(runs["auto"])  # best throughput over best throughput
    return {
        "benchmark": "spark_write_publish",
        "mode": "transaction",
        "rows": rows,
        "columns": 3,
        "master": "local[2]",
        "spark_partitions": 2,
        "repeat": repeat,
        "results": results,
        "ratios": {"auto_over_partition": ratio},
        "ratio_spread_per_round": {"auto_over_partition": _spread(runs, "auto", "partition")},
        "targets": {"auto_over_partition": 0.9},
        "targets_met": {"auto_over_partition": ratio >= 0.9},
        "machine": machine(),
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=20_000_000)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--url", help="ClickHouse HTTP url (default: start a private stack)")
    ap.add_argument(
        "--typed",
        action="store_true",
        help="typed table (UInt64, DateTime, Float32) vs matching table, transaction mode",
    )
    ap.add_argument(
        "--publish",
        action="store_true",
        help="transaction mode published at once (visibility=auto) vs per partition",
    )
    ap.add_argument("--out", default=None, help="result file (default: by benchmark)")
    a = ap.parse_args(argv)
    bench = run_typed if a.typed else run_publish if a.publish else run
    a.out = a.out or str(RESULT_TYPED if a.typed else RESULT_PUBLISH if a.publish else RESULT)
    if a.url:
        report = bench(a.url, a.rows, a.repeat)
    else:
        from server_patches.stack import start_stack, stop_stack

        d = Path(tempfile.mkdtemp(prefix="bench_stack_"))
        try:
            report = bench(start_stack(d).clickhouse_url, a.rows, a.repeat)
        finally:
            stop_stack(d, purge=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    write_result(a.out, report)
    print(json.dumps(report["ratios"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
