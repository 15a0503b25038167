"""The operator command line (``python -m clickhouse_tx``) run as a child process, and its test table.

The command-line tests write into ``<database>.events`` (``id UInt64``) through a
coordinator, then run the command and count what a read-committed reader sees.
"""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.interfaces import Target
from spark_datasource.testing.credentials import cli_args, target_fields


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m clickhouse_tx *args`` (2 min at most); its exit code and output, text.

    ``--user``/``--password-env`` are appended when the run has credentials
    (:mod:`spark_datasource.testing.credentials`): the child reads the password from the
    variable it inherits, never from its argv.
    """
    argv = [sys.executable, "-m", "clickhouse_tx", *args, *cli_args()]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def id_table(clickhouse_url: str, database: str) -> tuple[Target, ClickHouseHTTP]:
    """Create ``<database>.events (id UInt64)``; its target and an admin client."""
    admin = ClickHouseHTTP(Target(url=clickhouse_url, database=database, table="events", **target_fields()))
    admin.command(f"CREATE TABLE {q.qualified(database, 'events')} (id UInt64) ENGINE = MergeTree ORDER BY id")
    return Target(url=clickhouse_url, database=database, table="events", **target_fields()), admin


def id_batch(first: int, n: int = 100) -> list[pa.RecordBatch]:
    """Ids ``first .. first + n - 1`` as record batches of the ``id`` column."""
    return pa.table({"id": pa.array(range(first, first + n), pa.uint64())}).to_batches()


def visible_ids(admin: ClickHouseHTTP, target: Target) -> int:
    """Rows of ``target`` a read-committed reader sees (``implicit_transaction = 1``)."""
    return int(
        admin.command(
            f"SELECT count() FROM {q.qualified(target.database, target.table)} SETTINGS implicit_transaction = 1"
        ).strip()
    )
