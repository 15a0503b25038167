"""The driver's batched requests of a ``staging`` commit at P stages: the MOVEs and the markers.

Two figures behind ``docs/performance.md`` ("Partitions per micro-batch"), without Spark:

- P stage tables of one partition each are moved into one target by
  :func:`clickhouse_tx.modes.staging.publish.run_moves`, one at a time and
  :data:`~clickhouse_tx.modes.staging.publish.MOVES_AT_ONCE` at a time;
- P markers are inserted in one request as :meth:`CommitMarkers.insert_sql` writes
  them, and as a ``VALUES`` list with ``now64(3)`` in every row (the form it replaced).

Per figure the median of ``--rounds`` rounds; the two ways of moving alternate which
goes first.

    python -m benchmarks.stage_moves [--stages 128] [--rounds 6]   # starts its own stack

Writes ``benchmarks/results/stage_moves.json``.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.results_file import machine, run_on_server
from benchmarks.spark_write import run_sql

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "stage_moves.json"


def _staged(url: str, db: str, stages: int) -> tuple[str, list[str]]:
    """A fresh target and the MOVEs of ``stages`` stages of one row and one partition each."""
    from clickhouse_tx.modes.staging.tables import move_sql

    table = f"t_{uuid.uuid4().hex[:8]}"
    run_sql(url, f"CREATE TABLE {db}.{table} (id UInt64, d Date) ENGINE = MergeTree PARTITION BY d ORDER BY id")
    names = [f"{table}_s{i}" for i in range(stages)]
    for i, name in enumerate(names):
        run_sql(url, f"CREATE TABLE {db}.{name} AS {db}.{table}")
        run_sql(url, f"INSERT INTO {db}.{name} VALUES ({i}, '2026-01-01')")
    pid = run_sql(
        url, f"SELECT DISTINCT partition_id FROM system.parts WHERE database = '{db}' AND table = '{names[0]}'"
    )
    return table, [move_sql(db, name, pid.strip(), f"{db}.{table}") for name in names]


def _moves_ms(url: str, db: str, stages: int, at_once: int) -> float:
    """Milliseconds to move ``stages`` stages into a fresh target, ``at_once`` MOVEs at a time.

    Only this variant's tables exist while it runs, so both variants move among the same
    number of tables, and the server is left a second to settle after their set-up.
    """
    from clickhouse_tx.interfaces import Target
    from clickhouse_tx.modes.staging.publish import run_moves

    table, moves = _staged(url, db, stages)
    time.sleep(1.0)
    t0 = time.perf_counter()
    run_moves(Target(url=url, database=db, table=table), moves, at_once=at_once)
    took = (time.perf_counter() - t0) * 1000
    if int(run_sql(url, f"SELECT count() FROM {db}.{table}")) != stages:
        raise RuntimeError("not every stage was moved")
    names = [table] + [f"{table}_s{i}" for i in range(stages)]
    run_sql(url, "DROP TABLE " + ", ".join(f"{db}.{n}" for n in names) + " SYNC")
    return took


def _markers_ms(url: str, db: str, stages: int) -> dict[str, float]:
    """Milliseconds of one INSERT of ``stages`` markers: as written now, and with ``now64(3)`` per row."""
    from clickhouse_tx.interfaces import Mode, Prepared, Target, WriteContext
    from clickhouse_tx.store.markers import CommitMarkers

    markers = CommitMarkers(Target(url=url, database=db, table="events"))
    markers.ensure_table()
    txn = f"bench-{uuid.uuid4().hex[:8]}"
    ps = [
        dataclasses.replace(
            Prepared.for_attempt(WriteContext(txn, 1, i, 0), f"{txn}-b1-p{i}-a0", Mode.STAGING, url, f"{db}.events"),
            rows=500,
            checksum=i,
        )
        for i in range(stages)
    ]
    now = markers.insert_sql(*ps)
    rows = ", ".join(
        f"('{p.txn_id}', {p.batch}, {p.partition}, '{p.xid}', '{p.table}', {p.rows}, {p.checksum}, 'staging', now64(3))"
        for p in ps
    )
    per_row = f"INSERT INTO {markers.fq} VALUES {rows}"
    out = {}
    for name, sql in (("format", now), ("values_now64_per_row", per_row)):
        t0 = time.perf_counter()
        run_sql(url, sql)
        out[name] = (time.perf_counter() - t0) * 1000
    return out


def run(url: str, stages: int, rounds: int) -> dict[str, Any]:
    from clickhouse_tx.modes.staging.publish import MOVES_AT_ONCE

    db = f"bench_moves_{uuid.uuid4().hex[:6]}"
    run_sql(url, f"CREATE DATABASE {db}")
    moves: dict[str, list[float]] = {"1": [], str(MOVES_AT_ONCE): []}
    inserts: dict[str, list[float]] = {"format": [], "values_now64_per_row": []}
    for r in range(rounds):
        order = (1, MOVES_AT_ONCE) if r % 2 == 0 else (MOVES_AT_ONCE, 1)  # neither always runs first
        for at_once in order:
            moves[str(at_once)].append(_moves_ms(url, db, stages, at_once))
        for k, v in _markers_ms(url, db, stages).items():
            inserts[k].append(v)
        last_moves = [round(v[-1]) for v in moves.values()]
        last_inserts = [round(v[-1], 1) for v in inserts.values()]
        print(f"round {r + 1}: moves {last_moves} ms, markers {last_inserts} ms")
    return {
        "benchmark": "stage_moves",
        "stages": stages,
        "rounds": rounds,
        "machine": machine(),
        "moves_ms_median_by_at_once": {k: round(statistics.median(v), 1) for k, v in moves.items()},
        "markers_insert_ms_median": {k: round(statistics.median(v), 1) for k, v in inserts.items()},
        "moves_ms": moves,
        "markers_insert_ms": inserts,
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--stages", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--url", help="ClickHouse HTTP url (default: start a private stack)")
    ap.add_argument("--out", default=str(RESULT))
    a = ap.parse_args(argv)
    run_on_server(a.url, lambda url: run(url, a.stages, a.rounds), a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
