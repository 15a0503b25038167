"""Benchmark: the Spark batch job into one ClickHouse shard vs two, and the commit of a 16-partition batch.

The job is :mod:`benchmarks.spark_write`'s (``spark.range(rows)``, 3 columns, ``local[2]``,
2 Spark partitions), appended in mode ``transaction`` (``--mode`` to change) on a
2-shard embedded stack (``server_patches`` ``start_stack(shards=2)``), as:

- ``one_shard``: option ``url`` = shard 0's server (the one-server form);
- ``two_shards_by_key``: option ``shards`` with ``sharding_key=id`` (every partition's
  rows split over both shards, one xid per (partition, shard));
- ``two_shards_by_partition``: option ``shards`` without a key (each Spark partition
  whole to one shard).

Every shard runs on the same 2 cores, so the ratio shows what sharding costs, not what
it gains. Each of ``--repeat`` rounds runs the three once, interleaved; ratios compare
the best runs and ``ratio_spread_per_round`` gives min/median/max within rounds.

Then the **commit of a 16-partition batch**: ``--commit-rows`` rows in 16 Spark
partitions, written ``--repeat`` times with its own ``transactional_id`` and
``decision_log``, into one shard and by key over two; the driver's ``commit_seconds``
from the writer's metrics (:func:`spark_datasource.sink.metrics.read_metrics`).

    python -m benchmarks.shard_write --rows 20000000 --repeat 3

Writes ``benchmarks/results/shard_write.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.results_file import write_result
from benchmarks.spark_write import bench_frame, bench_session, run_sql

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "shard_write.json"
CONFIGS = ("one_shard", "two_shards_by_key", "two_shards_by_partition")
COLUMNS = "(id Int64, k Int32, v Float64)"


def _options(info: Any, config: str, mode: str, db: str, table: str) -> dict[str, str]:
    """The writer's options for ``config`` (see the module docstring)."""
    opts = {"database": db, "table": table, "mode": mode, "allow_nullable_into_non_nullable": "true"}
    if config == "one_shard":
        return {**opts, "url": info.clickhouse_urls[0][0]}
    opts["shards"] = info.shards_option
    return {**opts, "sharding_key": "id"} if config == "two_shards_by_key" else opts


def _urls(info: Any, config: str) -> list[str]:
    """The servers ``config`` writes to (the first replica of each shard)."""
    return [info.clickhouse_urls[0][0]] if config == "one_shard" else [r[0] for r in info.clickhouse_urls]


def _create(info: Any, config: str, db: str, table: str, mode: str) -> None:
    settings = " SETTINGS non_replicated_deduplication_window = 1000" if mode == "dedup" else ""
    for url in _urls(info, config):
        run_sql(url, f"CREATE TABLE {db}.{table} {COLUMNS} ENGINE = MergeTree ORDER BY id{settings}")


def _count_and_drop(info: Any, config: str, db: str, table: str) -> list[int]:
    """Rows on each shard ``config`` wrote to; the table is dropped."""
    counts = []
    for url in _urls(info, config):
        counts.append(int(run_sql(url, f"SELECT count() FROM {db}.{table} SETTINGS implicit_transaction = 1").strip()))
        run_sql(url, f"DROP TABLE {db}.{table} SYNC")
    return counts


def _timed(spark: Any, info: Any, config: str, mode: str, db: str, table: str, df: Any, **extra: str) -> float:
    """One append of ``df`` into a fresh ``table`` under ``config``; seconds (rows checked by the caller)."""
    _create(info, config, db, table, mode)
    t = time.perf_counter()
    df.write.format("clickhouse_tx").options(**_options(info, config, mode, db, table), **extra).mode("append").save()
    return time.perf_counter() - t


def throughput(spark: Any, info: Any, db: str, rows: int, repeat: int, mode: str) -> dict[str, list[float]]:
    """Seconds per configuration and round, the three interleaved in each round."""
    runs: dict[str, list[float]] = {c: [] for c in CONFIGS}
    for i in range(repeat):
        for config in CONFIGS:
            table = f"{config}_{i}"
            elapsed = _timed(spark, info, config, mode, db, table, bench_frame(spark, rows))
            counts = _count_and_drop(info, config, db, table)
            if sum(counts) != rows:
                raise RuntimeError(f"{config}: {counts} rows on the shards, expected {rows} in all")
            runs[config].append(elapsed)
            print(f"round {i} {config}: {rows / elapsed:,.0f} rows/s ({elapsed:.2f} s), per shard {counts}", flush=True)
    return runs


def commit_latency(spark: Any, info: Any, db: str, rows: int, repeat: int, mode: str, work: Path) -> dict[str, Any]:
    """The driver's commit of a 16-partition batch, into one shard and by key over two (seconds)."""
    from spark_datasource.sink.metrics import read_metrics

    out: dict[str, Any] = {}
    for config in ("one_shard", "two_shards_by_key"):
        seconds = []
        for i in range(repeat):
            table, txn = f"commit_{config}_{i}", f"bench-commit-{uuid.uuid4().hex[:8]}"
            log = work / txn
            df = spark.range(0, rows, 1, 16).selectExpr("id", "cast(id % 1000 as int) as k", "cast(id as double) as v")
            _timed(spark, info, config, mode, db, table, df, transactional_id=txn, decision_log=str(log))
            if sum(_count_and_drop(info, config, db, table)) != rows:
                raise RuntimeError(f"commit run {config}: rows lost or doubled")
            lines = [m for m in read_metrics(str(log)) if m.get("status") == "committed"]
            seconds.append(float(lines[-1]["commit_seconds"]))
            print(f"commit of 16 partitions, {config}: {seconds[-1] * 1000:.0f} ms", flush=True)
        out[config] = {"seconds": seconds, "median_s": statistics.median(seconds)}
    return out


def _spread(runs: dict[str, list[float]], config: str, base: str) -> dict[str, float]:
    per_round = sorted(runs[base][i] / runs[config][i] for i in range(len(runs[config])))
    return {"min": per_round[0], "median": per_round[len(per_round) // 2], "max": per_round[-1]}


def run(info: Any, rows: int, repeat: int, mode: str, commit_rows: int, work: Path) -> dict[str, Any]:
    spark = bench_session()
    db = f"bench_{uuid.uuid4().hex[:8]}"
    for url in _urls(info, "two_shards_by_key"):
        run_sql(url, f"CREATE DATABASE {db}")
    try:
        bench_frame(spark, 100_000).write.format("noop_arrow").mode("append").save()  # warm-up
        runs = throughput(spark, info, db, rows, repeat, mode)
        commit = commit_latency(spark, info, db, commit_rows, repeat, mode, work)
    finally:
        for url in _urls(info, "two_shards_by_key"):
            run_sql(url, f"DROP DATABASE IF EXISTS {db} SYNC")
        spark.stop()
    best = {c: rows / min(s) for c, s in runs.items()}
    return {
        "benchmark": "shard_write",
        "mode": mode,
        "rows": rows,
        "columns": 3,
        "master": "local[2]",
        "spark_partitions": 2,
        "shards": len(info.clickhouse_urls),
        "repeat": repeat,
        "results": {c: {"rows_per_s": best[c], "all_seconds": s} for c, s in runs.items()},
        "ratios": {f"{c}_over_one_shard": best[c] / best["one_shard"] for c in CONFIGS[1:]},
        "ratio_spread_per_round": {f"{c}_over_one_shard": _spread(runs, c, "one_shard") for c in CONFIGS[1:]},
        "commit_16_partitions": {"rows": commit_rows, **commit},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "note": "every shard on these cores"},
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=20_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--mode", default="transaction", choices=("transaction", "staging", "dedup"))
    ap.add_argument("--commit-rows", type=int, default=160_000, help="rows of the 16-partition commit batch")
    ap.add_argument("--out", default=str(RESULT))
    a = ap.parse_args(argv)
    from server_patches.stack import start_stack, stop_stack

    d = Path(tempfile.mkdtemp(prefix="bench_shards_"))
    try:
        info = start_stack(d / "stack", shards=2)
        report = run(info, a.rows, a.repeat, a.mode, a.commit_rows, d)
    finally:
        stop_stack(d / "stack", purge=True)
    write_result(a.out, report)
    print(json.dumps({"ratios": report["ratios"], "commit_16_partitions": report["commit_16_partitions"]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
