"""Bookkeeping records over many small batches: they stay at what one batch in flight needs.

Runs, through the real coordinator in mode ``dedup`` on a private embedded stack (or
``--url``), a stream of ``--batches`` micro-batches and ``--jobs`` batch jobs (each a
fresh transactional id, ended as the Spark writer ends it: ``DedupMode.forget_batch``),
each of ``--partitions`` partitions of ``--rows`` rows, into one table. Every
``--every`` batches (and after each job) it samples what ``python -m clickhouse_tx
status`` counts (:func:`clickhouse_tx.admin.bookkeeping.counts`). The issue's size is
1,000 micro-batches and 100 jobs (the defaults); ``--batches 200 --jobs 20`` is a quick run.

    python -m benchmarks.bookkeeping --batches 1000 --jobs 100 --json benchmarks/results/bookkeeping.json
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from typing import Any

import pyarrow as pa

from benchmarks.results_file import machine, run_on_server
from clickhouse_tx.admin.bookkeeping import counts
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.factory import build_coordinator, build_registry
from clickhouse_tx.interfaces import Target, WriteContext
from clickhouse_tx.modes.dedup.mode import DedupMode
from clickhouse_tx.protocol.coordinator import Coordinator

DATABASE = "bench_bookkeeping"


def _setup(url: str) -> Target:
    target = Target(url=url, database=DATABASE, table="events")
    with ClickHouseHTTP(dataclasses.replace(target, database="default")) as c:
        c.command(f"DROP DATABASE IF EXISTS {DATABASE} SYNC")
        c.command(f"CREATE DATABASE {DATABASE}")
        c.command(
            f"CREATE TABLE {DATABASE}.events (id UInt64, s String) ENGINE = MergeTree PARTITION BY id % 4 "
            "ORDER BY id SETTINGS non_replicated_deduplication_window = 1000"
        )
    return target


def _batch(co: Coordinator, txn: str, batch: int, first: int, parts: int, rows: int) -> None:
    """One batch of ``parts`` partitions of ``rows`` rows each, prepared and committed."""
    msgs = []
    for p in range(parts):
        start = first + p * rows
        t = pa.table({"id": pa.array(range(start, start + rows), pa.uint64()), "s": pa.array(["x"] * rows)})
        msgs.append(co.prepare(WriteContext(txn, batch, p, 0, "run"), iter(t.to_batches())))
    co.commit_batch(batch, msgs)


def _sample(target: Target, co: Coordinator, what: str, n: int, started: float) -> dict[str, Any]:
    doc = counts(target, build_registry(target))
    lay = doc["layouts"]
    records = sum(v for k, v in lay.items() if k not in ("batches", "unsealed_batches"))
    return {"after": what, "n": n, "s": round(time.monotonic() - started, 1), "layout_records": records, **doc}


def bench(url: str, batches: int, jobs: int, parts: int, rows: int, every: int) -> dict[str, Any]:
    """The samples of a stream of ``batches`` micro-batches, then of ``jobs`` jobs."""
    target, started, samples = _setup(url), time.monotonic(), []
    with tempfile.TemporaryDirectory(prefix="ctx-bench-bookkeeping-") as chk:
        stream = build_coordinator(target, "dedup", "stream", chk)
        for b in range(batches):
            _batch(stream, "stream", b, b * parts * rows, parts, rows)
            if (b + 1) % every == 0 or b + 1 == batches:
                samples.append(_sample(target, stream, "stream batch", b + 1, started))
                print(
                    f"{samples[-1]['s']:7.1f} s  stream batch {b + 1}: {samples[-1]['layout_records']} layout records"
                )
        base = batches * parts * rows
        for j in range(jobs):
            job = build_coordinator(target, "dedup", f"job{j}", chk)
            _batch(job, f"job{j}", 0, base + j * parts * rows, parts, rows)
            assert isinstance(job.mode_io, DedupMode)
            job.mode_io.forget_batch(target, f"job{j}", 0)  # the Spark writer's end of a job
            if (j + 1) % max(1, every // 10) == 0 or j + 1 == jobs:
                samples.append(_sample(target, job, "job", j + 1, started))
                print(f"{samples[-1]['s']:7.1f} s  job {j + 1}: {samples[-1]['layout_records']} layout records")
    peak = max(s["layout_records"] for s in samples)
    return {
        "benchmark": "bookkeeping",
        "batches": batches,
        "jobs": jobs,
        "partitions": parts,
        "rows_per_partition": rows,
        "one_batch_needs": 2 * parts + 2,  # a claim and an end record per partition, a seal, a first-run record
        "peak_layout_records": peak,
        "final": samples[-1],
        "samples": samples,
        "seconds": round(time.monotonic() - started, 1),
        "machine": machine(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=None, help="a server to run on (default: a private embedded stack)")
    ap.add_argument("--batches", type=int, default=1000, help="micro-batches of the stream (default 1000)")
    ap.add_argument("--jobs", type=int, default=100, help="batch jobs after the stream (default 100)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--rows", type=int, default=100, help="rows per partition")
    ap.add_argument("--every", type=int, default=50, help="sample the counts every this many batches")
    ap.add_argument("--json", default=None, help="write the result here (benchmarks/results/bookkeeping.json)")
    a = ap.parse_args()
    run_on_server(a.url, lambda url: bench(url, a.batches, a.jobs, a.partitions, a.rows, a.every), a.json)


if __name__ == "__main__":
    main()
