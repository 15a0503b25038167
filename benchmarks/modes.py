"""Each commit mode through the local server, no Spark: rows/s and commit latency.

Part 1 (throughput): the same Arrow data (``--rows`` per batch, 4 partitions) is
prepared and committed by the :class:`~clickhouse_tx.protocol.coordinator.Coordinator` in every
mode; rows/s over prepare + commit, as ratios to ``none`` measured in the same run.

Part 2 (commit latency): ``commit_batch`` wall time of small batches with 1, 4 and 16
partitions, p50 and p99 over ``--commits`` batches, per mode.

    python -m benchmarks.modes --json benchmarks/results/modes.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from benchmarks.results_file import run_on_server
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.factory import build_coordinator
from clickhouse_tx.interfaces import Target, WriteContext
from spark_datasource.testing.visibility import percentile

#: ``staging+batch``: mode staging with ``visibility=batch`` (the batch in one transaction).
MODES = ("none", "transaction", "staging", "staging+batch", "dedup")
DDL = (
    "CREATE TABLE IF NOT EXISTS {db}.{t} (id Int64, ts DateTime64(3), payload String) "
    "ENGINE = MergeTree ORDER BY id PARTITION BY intDiv(id, 100000000000) "
    "SETTINGS non_replicated_deduplication_window = 1000"
)


def make_partition(first: int, rows: int) -> pa.Table:
    ids = pa.array(range(first, first + rows), pa.int64())
    return pa.table(
        {
            "id": ids,
            "ts": pc.cast(pc.add(ids, 1_700_000_000_000), pa.timestamp("ms")),
            "payload": pc.binary_join_element_wise("event-", pc.cast(pc.bit_wise_and(ids, 1023), pa.string()), ""),
        }
    )


def _table(mode: str) -> str:
    return "t_" + mode.replace("+", "_")


def run_batch(
    target: Target, mode: str, txn: str, log: str, batch: int, parts: list[pa.Table], first_partition: int = 0
) -> tuple[float, float]:
    """Prepare every partition (in parallel, as executors would), then commit; (prepare s, commit s)."""
    mode, _, visibility = mode.partition("+")
    coord = build_coordinator(target, mode, txn, log, visibility=visibility or "partition")
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(min(4, len(parts))) as pool:
        msgs = list(
            pool.map(
                lambda ip: coord.prepare(
                    WriteContext(txn, batch, first_partition + ip[0], 0), iter(ip[1].to_batches(65536))
                ),
                enumerate(parts),
            )
        )
    t1 = time.perf_counter()
    fresh = build_coordinator(target, mode, txn, log, visibility=visibility or "partition")  # as Spark does
    fresh.commit_batch(batch, msgs)
    return t1 - t0, time.perf_counter() - t1


def bench(url: str, rows: int, repeat: int, commits: int) -> dict[str, Any]:
    db = f"bench_{uuid.uuid4().hex[:8]}"
    admin = ClickHouseHTTP(Target(url=url, database="default", table="x"))
    admin.command(f"CREATE DATABASE {db}")
    logroot = tempfile.mkdtemp(prefix="ctx-bench-log-")
    out: dict[str, Any] = {
        "benchmark": "commit_modes",
        "rows_per_batch": rows,
        "partitions": 4,
        "repeat": repeat,
        "throughput": {},
        "commit_latency_ms": {},
    }
    try:
        for mode in MODES:
            admin.command(DDL.format(db=db, t=_table(mode)))
        # Throughput: rounds alternate modes so drift hits all of them alike.
        secs: dict[str, list[float]] = {m: [] for m in MODES}
        for r in range(repeat):
            # Distinct rows per round: identical blocks would be dropped by the dedup window.
            parts = [make_partition(r * rows + p * (rows // 4), rows // 4) for p in range(4)]
            for mode in MODES:
                target = Target(url=url, database=db, table=_table(mode))
                prep, com = run_batch(target, mode, f"tp-{mode}", logroot, r, parts)
                secs[mode].append(prep + com)
            print(
                f"  throughput round {r + 1}/{repeat}: "
                + ", ".join(f"{m} {rows / secs[m][-1]:,.0f} rows/s" for m in MODES),
                flush=True,
            )
        base = rows / statistics.median(secs["none"])
        for mode in MODES:
            rate = rows / statistics.median(secs[mode])
            count = int(admin.command(f"SELECT count() FROM {db}.{_table(mode)}", settings={}).strip() or 0)
            out["throughput"][mode] = {
                "rows_per_s_median": round(rate),
                "ratio_to_none": round(rate / base, 3),
                "rows_visible": count,
                "rows_expected": rows * repeat,
            }
            if count != rows * repeat:
                raise SystemExit(f"{mode}: {count} rows visible, expected {rows * repeat}")
        # Commit latency: small batches, so the protocol's own cost dominates.
        for mode in MODES:
            target = Target(url=url, database=db, table=_table(mode))
            out["commit_latency_ms"][mode] = {}
            for n in (1, 4, 16):
                lat = []
                for b in range(commits):
                    first = 10**9 * (1 + b) + 10**6 * n
                    small = [make_partition(first + 1000 * i, 1000) for i in range(n)]
                    _, com = run_batch(target, mode, f"lat-{mode}-{n}", logroot, 1000 + b, small)
                    lat.append(com * 1000)
                p50, p99 = percentile(lat, 50) or 0.0, percentile(lat, 99) or 0.0  # lat has `commits` entries
                out["commit_latency_ms"][mode][str(n)] = {"p50": round(p50, 1), "p99": round(p99, 1)}
                print(
                    f"  commit latency {mode:13s} {n:2d} partitions: p50 {p50:6.1f} ms, p99 {p99:6.1f} ms", flush=True
                )
    finally:
        admin.command(f"DROP DATABASE IF EXISTS {db} SYNC")
    out["targets"] = {"transaction_ratio_to_none": 0.9, "commit_16_partitions_p50_ms": 100}
    out["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out["machine"] = {"cpus": os.cpu_count()}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows per batch (4 partitions)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--commits", type=int, default=30, help="batches per latency point")
    ap.add_argument("--url", help="an existing server (default: start the embedded stack)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    run_on_server(args.url, lambda url: bench(url, args.rows, args.repeat, args.commits), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
