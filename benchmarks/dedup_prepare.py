"""What mode dedup's checks add to one prepare: dedup against none, small partitions.

    python -m benchmarks.dedup_prepare --json benchmarks/results/dedup_prepare.json

Starts the embedded stack, then prepares one partition of ``--rows`` rows per batch in
modes ``none`` and ``dedup`` in turn (same rows, separate tables, registration
included) and reports the p50 wall time of each. For a one-chunk partition, dedup adds
a read of the batch's markers, the registry fence and a ``system.parts`` read (the
window's baseline) to the INSERT.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

import pyarrow as pa

from benchmarks.results_file import write_result
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.factory import build_coordinator
from clickhouse_tx.interfaces import Target, WriteContext
from server_patches import stack


def _coordinators(url: str, checkpoint: str) -> dict[str, Any]:
    admin = ClickHouseHTTP(Target(url=url, database="default", table="x"))
    admin.command("CREATE DATABASE IF NOT EXISTS bench_dedup")
    out = {}
    for mode in ("none", "dedup"):
        admin.command(
            f"CREATE TABLE bench_dedup.{mode} (id UInt64, s String) ENGINE = MergeTree "
            "ORDER BY id SETTINGS non_replicated_deduplication_window = 1000"
        )
        co = build_coordinator(
            Target(url=url, database="bench_dedup", table=mode), mode, "bench", f"{checkpoint}/{mode}"
        )
        co.validate(pa.schema([("id", pa.uint64()), ("s", pa.string())]))
        out[mode] = co
    return out


def measure(url: str, rows: int, batches: int) -> dict[str, Any]:
    """p50 prepare milliseconds per mode (the first 5 batches are warm-up)."""
    with tempfile.TemporaryDirectory() as chk:
        cos = _coordinators(url, chk)
        times: dict[str, list[float]] = {m: [] for m in cos}
        for b in range(batches + 5):
            data = pa.record_batch(
                {"id": pa.array(range(b * rows, (b + 1) * rows), pa.uint64()), "s": pa.array(["x"] * rows)}
            )
            for mode, co in cos.items():  # interleaved: a loaded machine slows both alike
                t = time.perf_counter()
                co.prepare(WriteContext("bench", b, 0, 0), iter([data]))
                times[mode].append((time.perf_counter() - t) * 1000)
        return {m: round(statistics.median(v[5:]), 1) for m, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--batches", type=int, default=50)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        info = stack.start_stack(d)
        try:
            p50 = measure(info.clickhouse_url, args.rows, args.batches)
        finally:
            stack.stop_stack(d)
    print(
        f"prepare of one {args.rows}-row partition, p50 over {args.batches}: "
        f"none {p50['none']} ms, dedup {p50['dedup']} ms"
    )
    if args.json:
        write_result(
            args.json, {"benchmark": "dedup_prepare", "rows": args.rows, "batches": args.batches, "p50_ms": p50}
        )


if __name__ == "__main__":
    main()
