"""Can the driver make a whole batch visible at once? Partition moves inside one ClickHouse transaction.

Issue 9 item 8 asks for a mode that makes a batch visible at once, e.g. the driver
moving every partition's staged data inside one transaction. These tests record what
the embedded engine (ClickHouse 26.9 on chdb, experimental transactions on) does with
the statements such a mode would use, inside ``BEGIN TRANSACTION`` in one session:
read-committed readers (``implicit_transaction = 1``) see nothing before ``COMMIT``
and everything after it, and ``ROLLBACK`` undoes them. No such mode is built yet
(``docs/modes.md``); ``-s`` prints the cost of each way.
"""

from __future__ import annotations

import time
from typing import Iterator

import pytest

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.interfaces import Target
from spark_datasource.testing.credentials import target_fields

ROWS = 200_000


@pytest.fixture
def tables(clickhouse_url: str, database: str) -> Iterator[tuple[ClickHouseHTTP, Target]]:
    """An empty target and two stage tables of ``ROWS`` rows each, 2 table partitions each."""
    target = Target(url=clickhouse_url, database=database, table="tgt", **target_fields())
    admin = ClickHouseHTTP(target)
    for name in ("tgt", "s1", "s2"):
        admin.command(
            f"CREATE TABLE {q.qualified(database, name)} (id UInt64, s String) "
            "ENGINE = MergeTree PARTITION BY id % 2 ORDER BY id"
        )
    for name, start in (("s1", 0), ("s2", 10 * ROWS)):
        admin.command(
            f"INSERT INTO {q.qualified(database, name)} SELECT number + {start}, toString(number) FROM numbers({ROWS})"
        )
    yield admin, target
    admin.close()


def count(admin: ClickHouseHTTP, database: str, table: str) -> int:
    return int(
        admin.command(f"SELECT count() FROM {q.qualified(database, table)} SETTINGS implicit_transaction = 1").strip()
    )


STATEMENTS = {
    "attach_partition_from": [
        f"ALTER TABLE {{tgt}} ATTACH PARTITION ID '{p}' FROM {{{s}}}" for s in ("s1", "s2") for p in ("0", "1")
    ],
    "insert_select": ["INSERT INTO {tgt} SELECT * FROM {s1}", "INSERT INTO {tgt} SELECT * FROM {s2}"],
}


@pytest.mark.parametrize("how", sorted(STATEMENTS))
def test_several_stage_tables_copied_in_one_transaction_appear_together_at_commit(
    tables: tuple[ClickHouseHTTP, Target], how: str
) -> None:
    admin, target = tables
    names = {n: q.qualified(target.database, n) for n in ("tgt", "s1", "s2")}
    session = ClickHouseHTTP(target, session_id=f"atomic-{how}-{target.database}", session_timeout=60)
    started = time.monotonic()
    session.command("BEGIN TRANSACTION")
    for statement in STATEMENTS[how]:
        session.command(statement.format(**names))
    before = count(admin, target.database, "tgt")
    session.command("COMMIT")
    took = time.monotonic() - started
    print(f"{how}: 2 stage tables x {ROWS} rows into the target in one transaction: {took * 1000:.0f} ms")
    assert before == 0
    assert count(admin, target.database, "tgt") == 2 * ROWS
    assert count(admin, target.database, "s1") == ROWS  # copied, not moved: the stages stay


def test_a_move_partition_inside_a_transaction_is_undone_by_rollback(tables: tuple[ClickHouseHTTP, Target]) -> None:
    admin, target = tables
    session = ClickHouseHTTP(target, session_id=f"atomic-move-{target.database}", session_timeout=60)
    session.command("BEGIN TRANSACTION")
    session.command(
        f"ALTER TABLE {q.qualified(target.database, 's1')} MOVE PARTITION ID '1' "
        f"TO TABLE {q.qualified(target.database, 'tgt')}"
    )
    assert count(admin, target.database, "tgt") == 0
    session.command("ROLLBACK")
    assert count(admin, target.database, "tgt") == 0
    assert count(admin, target.database, "s1") == ROWS
