"""Test tables of ``(id UInt64, s String)`` on the embedded stack, and reads of what they hold.

Used by the integration tests of the commit modes (``test_modes``, ``test_commit_path``,
``test_dedup_mode``); every read is ``implicit_transaction = 1``, what a
read-committed reader sees.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pytest

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.factory import build_coordinator
from clickhouse_tx.interfaces import Target
from clickhouse_tx.modes.dedup.chunks import ChunkSizing
from clickhouse_tx.modes.dedup.mode import DedupMode
from clickhouse_tx.protocol.coordinator import Coordinator
from clickhouse_tx.store.markers import MARKERS_TABLE
from spark_datasource.testing.credentials import target_fields

TXN = "q1"
DEDUP_TXN = "dq"  # the query of the dedup-mode tests
PARTITIONS = 4  # the tables below are PARTITION BY id % 4


def rows(n: int, start: int = 0) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(start, start + n), pa.uint64()),
            "s": pa.array([f"v{i}" for i in range(start, start + n)]),
        }
    )


def batches(t: pa.Table, size: int = 250) -> Iterator[pa.RecordBatch]:
    return iter(t.to_batches(max_chunksize=size))


def make_table(
    admin: ClickHouseHTTP,
    database: str,
    table: str = "events",
    *,
    engine: str = "MergeTree",
    settings: str = "non_replicated_deduplication_window = 1000",
) -> Target:
    tail = f" PARTITION BY id % {PARTITIONS} ORDER BY id" if "MergeTree" in engine else ""
    if settings and "MergeTree" in engine:
        tail += f" SETTINGS {settings}"
    admin.command(f"CREATE TABLE {q.qualified(database, table)} (id UInt64, s String) ENGINE = {engine}{tail}")
    return Target(url=admin.target.url, database=database, table=table, **target_fields())


def committed_count(admin: ClickHouseHTTP, target: Target) -> int:
    fq = q.qualified(target.database, target.table)
    return int(admin.query_json(f"SELECT count() AS c FROM {fq} SETTINGS implicit_transaction = 1")[0]["c"])


def distinct_ids(admin: ClickHouseHTTP, target: Target) -> int:
    fq = q.qualified(target.database, target.table)
    return int(admin.query_json(f"SELECT uniqExact(id) AS c FROM {fq} SETTINGS implicit_transaction = 1")[0]["c"])


def tables(admin: ClickHouseHTTP, database: str) -> set[str]:
    return {
        r["name"]
        for r in admin.query_json("SELECT name FROM system.tables WHERE database = {d:String}", params={"d": database})
    }


def markers(admin: ClickHouseHTTP, database: str) -> list[dict[str, Any]]:
    if MARKERS_TABLE not in tables(admin, database):
        return []
    return admin.query_json(
        f"SELECT xid, `partition`, rows FROM {q.qualified(database, MARKERS_TABLE)} "
        "ORDER BY `partition` SETTINGS implicit_transaction = 1"
    )


def events_table(url: str, database: str, columns: str, settings: str = "") -> tuple[ClickHouseHTTP, str]:
    """A MergeTree ``events (<columns>)`` ordered by ``id``; an admin client and its quoted name."""
    admin = ClickHouseHTTP(Target(url=url, database=database, table="events", **target_fields()))
    fq = q.qualified(database, "events")
    admin.command(
        f"CREATE TABLE {fq} ({columns}) ENGINE = MergeTree ORDER BY id" + (f" SETTINGS {settings}" if settings else "")
    )
    return admin, fq


def dedup_coordinator(
    target: Target, tmp_path: Path, chunk_rows: int | ChunkSizing = 300, xid: str | None = None
) -> Coordinator:
    """A mode-dedup coordinator of query ``DEDUP_TXN``: ``chunk_rows`` rows a token (or that
    sizing), every xid ``xid`` if given."""
    co = build_coordinator(target, "dedup", DEDUP_TXN, str(tmp_path))
    sizing = chunk_rows if isinstance(chunk_rows, ChunkSizing) else ChunkSizing.fixed(chunk_rows)
    co.context = dataclasses.replace(co.context, mode_io=DedupMode(sizing, registry=co.registry))
    if xid is not None:
        co.xid_factory = lambda *_: xid
    return co


def recording_requests(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every request any :class:`ClickHouseHTTP` sends from now on, as ``<url params> <body>``
    (until ``monkeypatch.undo()``)."""
    sent: list[str] = []
    post = ClickHouseHTTP._post

    def recording(self: ClickHouseHTTP, **kw: object) -> object:
        sent.append(f"{kw['url_params']} {kw['data']!r}")
        return post(self, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(ClickHouseHTTP, "_post", recording)
    return sent
