"""A test database on every server of a sharded stack, and reads of what each shard holds.

Used by the sharded integration, Spark and torture tests; every read is
``implicit_transaction = 1`` (what a read-committed reader sees).
"""

from __future__ import annotations

import uuid
from typing import Iterator, Sequence

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.interfaces import Target
from server_patches.stack_files import StackInfo
from tests.helpers.tables import PARTITIONS


def every_url(stack: StackInfo) -> list[str]:
    return [u for replicas in stack.clickhouse_urls for u in replicas]


def create_everywhere(stack: StackInfo, sql: str) -> None:
    """Run ``sql`` on every server of ``stack``."""
    for url in every_url(stack):
        with ClickHouseHTTP(Target(url=url, database="default", table="x")) as c:
            c.command(sql)


def sharded_table(stack: StackInfo, *, table: str = "events", columns: str = "id UInt64, s String") -> Target:
    """A fresh database with ``table`` (MergeTree, PARTITION BY id % 4, a dedup window) on
    every server; the Target names shard 0's first server."""
    database = f"sh_{uuid.uuid4().hex[:10]}"
    create_everywhere(stack, f"CREATE DATABASE {q.quote_identifier(database)}")
    create_everywhere(
        stack,
        f"CREATE TABLE {q.qualified(database, table)} ({columns}) ENGINE = MergeTree "
        f"PARTITION BY id % {PARTITIONS} ORDER BY id SETTINGS non_replicated_deduplication_window = 1000",
    )
    return Target(url=stack.clickhouse_url, database=database, table=table)


def drop_everywhere(stack: StackInfo, database: str) -> None:
    create_everywhere(stack, f"DROP DATABASE IF EXISTS {q.quote_identifier(database)} SYNC")


def ids_per_shard(stack: StackInfo, target: Target, column: str = "id") -> list[list[int]]:
    """Per shard (its first replica), every committed value of ``column``, sorted."""
    out = []
    for replicas in stack.clickhouse_urls:
        with ClickHouseHTTP(Target(url=replicas[0], database=target.database, table=target.table)) as c:
            got = c.query_json(
                f"SELECT {q.quote_identifier(column)} AS v FROM {q.qualified(target.database, target.table)} "
                "ORDER BY v SETTINGS implicit_transaction = 1"
            )
        out.append([int(r["v"]) for r in got])
    return out


def counts(per_shard: Sequence[Sequence[int]]) -> list[int]:
    return [len(s) for s in per_shard]


def cleanup(stack: StackInfo, target: Target) -> Iterator[None]:
    """For a fixture: yield, then drop the database on every server."""
    try:
        yield
    finally:
        drop_everywhere(stack, target.database)
