"""Round trips of one micro-batch of the ``clickhouse_tx`` sink, per mode, without Spark.

The writer's per-batch path as Spark runs it, in one process: 8 partition attempts
prepared (the executors' :meth:`Coordinator.prepare`, in 2 threads like ``local[2]``)
and the driver's :meth:`Coordinator.commit_batch`, each through a coordinator built
the way the writer builds one (:func:`spark_datasource.sink.writer.coordinator_for`, so
per-process caches behave as in a reused Python worker). Every ClickHouse HTTP
request is recorded (:mod:`benchmarks.http_trace`); the report gives, per mode, the
requests of one steady-state batch (the 3rd, after the per-process caches are warm) by
side and statement kind, the prepare's summed request time per kind, and the wall
time of the prepare and commit phases. Counts do
not depend on machine load; times do.

    python -m benchmarks.batch_round_trips            # starts its own stack

Writes ``benchmarks/results/batch_round_trips.json``.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks import http_trace
from benchmarks.results_file import write_result
from benchmarks.spark_write import run_sql

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "batch_round_trips.json"
MODES = ("none", "transaction", "staging", "dedup")
PARTITIONS = 8
BATCHES = 3


def _rows(batch: int, part: int, n: int = 10) -> pa.RecordBatch:
    start = (batch * PARTITIONS + part) * n
    ids = pa.array(range(start, start + n), pa.int64())
    return pa.record_batch(
        [ids, pa.array([i % 1000 for i in range(n)], pa.int32()), pa.array([i * 0.5 for i in range(n)], pa.float64())],
        names=["id", "k", "v"],
    )


def _one_mode(url: str, db: str, mode: str, workdir: Path, trace: Path) -> dict[str, Any]:
    from clickhouse_tx.interfaces import WriteContext
    from spark_datasource.options.writer_options import WriterOptions
    from spark_datasource.sink.writer import coordinator_for

    settings = " SETTINGS non_replicated_deduplication_window = 1000" if mode == "dedup" else ""
    run_sql(url, f"CREATE TABLE {db}.{mode} (id Int64, k Int32, v Float64) ENGINE = MergeTree ORDER BY id{settings}")
    opts = WriterOptions.parse(
        {
            "url": url,
            "database": db,
            "table": mode,
            "mode": mode,
            "transactional_id": f"rt_{mode}_{uuid.uuid4().hex[:6]}",
            "decision_log": f"file://{workdir}/{mode}",
        },
        streaming=True,
    )
    txn = opts.txn_id()
    run_id = uuid.uuid4().hex  # one per run of the query, as the Spark writer draws it
    out: dict[str, Any] = {}
    for batch in range(BATCHES):
        t0 = time.time()

        def prepare(part: int, batch: int = batch) -> Any:
            ctx = WriteContext(txn_id=txn, batch=batch, partition=part, attempt=0, run=run_id)
            return coordinator_for(opts, txn).prepare(ctx, iter([_rows(batch, part)]))

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            prepared = list(pool.map(prepare, range(PARTITIONS)))
        t1 = time.time()
        report = coordinator_for(opts, txn).commit_batch(batch, prepared)
        t2 = time.time()
        if batch == BATCHES - 1:
            lines = [x for x in http_trace.read(trace) if t0 <= x["t"] <= t2]
            prep = [x for x in lines if x["t"] < t1]
            comm = [x for x in lines if x["t"] >= t1]
            out = {
                "prepare_requests": len(prep),
                "commit_requests": len(comm),
                "prepare_by_kind": _kinds(prep),
                "prepare_ms_by_kind": _kinds(prep, ms=True),
                "commit_by_kind": _kinds(comm),
                "prepare_wall_s": round(t1 - t0, 4),
                "commit_wall_s": round(t2 - t1, 4),
                "commit_steps_s": {k: round(v, 4) for k, v in report.durations.items()},
            }
    got = int(run_sql(url, f"SELECT count() FROM {db}.{mode} SETTINGS implicit_transaction = 1").strip())
    if got != BATCHES * PARTITIONS * 10:
        raise RuntimeError(f"{mode}: {got} rows, expected {BATCHES * PARTITIONS * 10}")
    return out


def _kinds(lines: list[dict[str, Any]], *, ms: bool = False) -> dict[str, Any]:
    """Per statement kind, its requests' count, or (``ms``) their summed time: where a task's time goes."""
    sums: dict[str, float] = {}
    for x in lines:
        sums[x["kind"]] = sums.get(x["kind"], 0) + (x["s"] * 1000 if ms else 1)
    return {k: round(v, 1) if ms else v for k, v in sorted(sums.items())}


def run(url: str, modes: list[str]) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="bench_rt_"))
    trace = workdir / "trace.jsonl"
    os.environ[http_trace.ENV] = str(trace)
    http_trace.install()
    db = f"bench_{uuid.uuid4().hex[:8]}"
    run_sql(url, f"CREATE DATABASE {db}")
    try:
        results = {m: _one_mode(url, db, m, workdir, trace) for m in modes}
    finally:
        run_sql(url, f"DROP DATABASE IF EXISTS {db} SYNC")
    return {
        "benchmark": "batch_round_trips",
        "partitions": PARTITIONS,
        "rows_per_partition": 10,
        "measured_batch": BATCHES - 1,
        "results": results,
        "machine": {"cpus": os.cpu_count(), "note": "shared and loaded while measured: times are indicative"},
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--url", help="ClickHouse HTTP url (default: start a private stack)")
    ap.add_argument("--out", default=str(RESULT))
    a = ap.parse_args(argv)
    modes = [m for m in a.modes.split(",") if m]
    if a.url:
        report = run(a.url, modes)
    else:
        from server_patches.stack import start_stack, stop_stack

        d = Path(tempfile.mkdtemp(prefix="bench_stack_"))
        try:
            report = run(start_stack(d).clickhouse_url, modes)
        finally:
            stop_stack(d, purge=True)
    write_result(a.out, report)
    print(json.dumps({m: {k: v for k, v in r.items()} for m, r in report["results"].items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
