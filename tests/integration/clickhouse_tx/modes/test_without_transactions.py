"""Modes ``staging`` and ``dedup`` on a server without experimental transactions.

Most ClickHouse servers run without ``allow_experimental_transactions``. The embedded
stack starts such a server with ``start_stack(..., transactions=False)``: there
``SETTINGS implicit_transaction = 1`` fails ("Transactions are not supported").
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pyarrow as pa
import pytest

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.errors import ConfigurationError, ServerError
from clickhouse_tx.factory import build_coordinator, build_mode_io
from clickhouse_tx.interfaces import CommitOutcome, Target, WriteContext
from clickhouse_tx.store.markers import CommitMarkers

DB = "no_tx"
pytestmark = pytest.mark.embedded_only("starts a stack of its own without transactions")


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    from server_patches import stack

    d = tmp_path_factory.mktemp("no_tx_stack")
    info = stack.start_stack(d, transactions=False)
    try:
        ClickHouseHTTP(Target(url=info.clickhouse_url, database="default", table="x")).command(
            f"CREATE DATABASE {q.quote_identifier(DB)}"
        )
        yield info.clickhouse_url
    finally:
        stack.stop_stack(d)


def _table(url: str, name: str, settings: str = "") -> tuple[Target, ClickHouseHTTP]:
    target = Target(url=url, database=DB, table=name)
    admin = ClickHouseHTTP(target)
    admin.command(
        f"CREATE TABLE {q.qualified(DB, name)} (id UInt64) ENGINE = MergeTree ORDER BY id"
        + (f" SETTINGS {settings}" if settings else "")
    )
    return target, admin


def _rows(first: int, n: int = 100) -> Callable[[], object]:
    return lambda: iter(pa.table({"id": pa.array(range(first, first + n), pa.uint64())}).to_batches())


def test_the_server_started_without_transactions_refuses_implicit_transaction(url: str) -> None:
    _, admin = _table(url, "probe")
    with pytest.raises(ServerError, match="Transactions are not supported"):
        admin.command(f"SELECT count() FROM {q.qualified(DB, 'probe')} SETTINGS implicit_transaction = 1")


@pytest.mark.parametrize("mode, settings", [("staging", ""), ("dedup", "non_replicated_deduplication_window = 100")])
def test_staging_and_dedup_commit_look_up_and_replay_exactly_once_without_transactions(
    url: str, tmp_path: Path, mode: str, settings: str
) -> None:
    target, admin = _table(url, f"events_{mode}", settings)
    txn = f"q-{mode}"
    coord = build_coordinator(target, mode, txn, str(tmp_path))
    coord.validate(pa.schema([("id", pa.uint64())]))
    msgs = [coord.prepare(WriteContext(txn, 0, p, 0), _rows(100 * p)()) for p in range(3)]
    coord.commit_batch(0, msgs)
    # A replay of the done batch (new attempts of the same partitions) changes nothing.
    again = [coord.prepare(WriteContext(txn, 0, p, 1), _rows(100 * p)()) for p in range(3)]
    coord.commit_batch(0, again)
    count = admin.command(f"SELECT count(), uniqExact(id) FROM {q.qualified(DB, target.table)}").split()
    assert count == ["300", "300"]
    mode_io = build_mode_io(mode)
    assert [mode_io.lookup(target, m) for m in msgs] == [CommitOutcome.COMMITTED] * 3
    assert len(CommitMarkers(target).list(txn, 0)) == 3


def test_transaction_mode_is_refused_before_any_write_naming_the_missing_setting(url: str) -> None:
    target, _ = _table(url, "events_tx")
    with pytest.raises(ConfigurationError, match="allow_experimental_transactions"):
        build_mode_io("transaction").validate(target, pa.schema([("id", pa.uint64())]))


def test_verify_checks_a_staging_table_on_a_server_without_transactions(url: str, tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    target, admin = _table(url, "events_verify")
    admin.command(
        f"ALTER TABLE {q.qualified(DB, 'events_verify')} ADD COLUMN topic String DEFAULT 't', "
        "ADD COLUMN partition Int32 DEFAULT 0, ADD COLUMN offset Int64 MATERIALIZED id"
    )
    coord = build_coordinator(target, "staging", "q-verify", str(tmp_path))
    coord.commit_batch(0, [coord.prepare(WriteContext("q-verify", 0, 0, 0), _rows(0)())])
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "clickhouse_tx",
            "verify",
            "--url",
            url,
            "--table",
            f"{DB}.events_verify",
            "--checkpoint",
            str(tmp_path),
            "--json",
            "-",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["clean"] is True


def test_visibility_batch_is_refused_on_a_server_without_transactions_and_says_what_it_needs(url: str) -> None:
    target, _ = _table(url, "batch_visibility")
    with pytest.raises(ConfigurationError, match="visibility=batch needs allow_experimental_transactions"):
        build_mode_io("staging", visibility="batch").validate(target, pa.schema([("id", pa.uint64())]))
