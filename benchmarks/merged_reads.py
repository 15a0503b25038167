"""Two small reads of a ``dedup`` chunk as two requests, and as one statement.

Before each chunk a ``dedup`` task reads its registry entry (the fence) and the table's
highest block number (the window). This measures, without Spark, whether folding the
two into one statement would make a chunk's checks cheaper:

- ``two_requests``: the code's own reads, ``KeeperMapRegistry.get`` then
  :func:`~clickhouse_tx.modes.dedup.window.max_block_number`, one after the other;
- ``one_statement``: both as scalar subqueries of one ``SELECT``, as the tasks send them
  (:func:`~clickhouse_tx.modes.dedup.window.fence_and_blocks`);
- ``select_1``: ``SELECT 1``, the cost of a request that reads nothing.

Per figure the median over ``--rounds`` rounds of ``--calls`` calls each; the three
alternate which goes first.

    python -m benchmarks.merged_reads [--rounds 6] [--calls 100]   # starts its own stack

Writes ``benchmarks/results/merged_reads.json``.
"""

from __future__ import annotations

import statistics
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from benchmarks.results_file import machine, run_on_server
from benchmarks.spark_write import run_sql

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "merged_reads.json"


def _median_ms(call: Callable[[], object], calls: int) -> float:
    """Median milliseconds of ``calls`` calls (after 5 not counted)."""
    for _ in range(5):
        call()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def _variants(url: str, db: str) -> dict[str, Callable[[], object]]:
    """The three ways to read, over one registered xid and a table with parts."""
    from clickhouse_tx.client.http import ClickHouseHTTP
    from clickhouse_tx.interfaces import Mode, Prepared, RegistryEntry, Target, WriteContext
    from clickhouse_tx.modes.dedup.window import fence_and_blocks, max_block_number
    from clickhouse_tx.store.registry import KeeperMapRegistry

    target = Target(url=url, database=db, table="events")
    run_sql(url, f"CREATE TABLE {db}.events (id UInt64) ENGINE = MergeTree ORDER BY id")
    for i in range(10):
        run_sql(url, f"INSERT INTO {db}.events VALUES ({i})")
    registry = KeeperMapRegistry(target)
    xid = f"bench-{uuid.uuid4().hex[:8]}"
    p = Prepared.for_attempt(WriteContext("bench", 1, 0, 0), xid, Mode.DEDUP, url, f"{db}.events")
    registry.register(RegistryEntry.of_attempt(p, "initialized", int(time.time() * 1000)))
    client = ClickHouseHTTP(target)
    return {
        "two_requests": lambda: (registry.get(xid), max_block_number(client, target)),
        "one_statement": lambda: fence_and_blocks(client, registry, xid, [target]),
        "select_1": lambda: client.query_json("SELECT 1"),
    }


def run(url: str, rounds: int, calls: int) -> dict[str, Any]:
    db = f"bench_reads_{uuid.uuid4().hex[:6]}"
    run_sql(url, f"CREATE DATABASE {db}")
    variants = _variants(url, db)
    names = list(variants)
    ms: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # each goes first in turn
            ms[name].append(_median_ms(variants[name], calls))
        print(f"round {r + 1}: " + ", ".join(f"{n} {v[-1]:.2f} ms" for n, v in ms.items()))
    run_sql(url, f"DROP DATABASE {db} SYNC")
    medians = {n: round(statistics.median(v), 2) for n, v in ms.items()}
    return {
        "benchmark": "merged_reads",
        "rounds": rounds,
        "calls_per_round": calls,
        "machine": machine(),
        "ms_median": medians,
        "one_statement_over_two_requests": round(medians["one_statement"] / medians["two_requests"], 2),
        "ms_by_round": {n: [round(x, 2) for x in v] for n, v in ms.items()},
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--url", help="ClickHouse HTTP url (default: start a private stack)")
    ap.add_argument("--out", default=str(RESULT))
    a = ap.parse_args(argv)
    run_on_server(a.url, lambda url: run(url, a.rounds, a.calls), a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
