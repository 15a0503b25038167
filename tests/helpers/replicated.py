"""The Replicated profile of ``make test-external``: targets on the user's cluster, and their reads.

The embedded engine creates ``Replicated*MergeTree`` tables but never writes into them
(its replicas stay read-only), so writes into them are certified only against a real
cluster: ``CLICKHOUSE_TX_EXTERNAL_URL`` and ``CLICKHOUSE_TX_EXTERNAL_CLUSTER`` (a cluster
of the server's ``remote_servers``) set. The targets are created ``ON CLUSTER`` with the
cluster's own macros (``{shard}``, ``{replica}``), as a user creates theirs.

No ClickHouse transaction can hold a Replicated table, so reads here never use
``implicit_transaction``; they use ``select_sequential_consistency = 1`` instead, so a
read on another replica than the writer's sees every committed row.
"""

from __future__ import annotations

from clickhouse_tx.client.sql import qualified, quote_identifier
from tests.helpers.external import ENV_CLUSTER, ENV_URL, External

SKIP_REASON = (
    f"needs a real ClickHouse cluster: set {ENV_URL} and {ENV_CLUSTER} "
    "(the embedded engine cannot write into Replicated tables)"
)
#: The Keeper path of every target: the server fills in the macros (``{database}`` and
#: ``{table}`` at CREATE, ``{shard}`` per host), so each shard's replicas share one path.
KEEPER_PATH = "/clickhouse/tables/{shard}/{database}/{table}"
#: Blocks kept for deduplication: far more than a test's micro-batches insert.
DEDUP_WINDOW = 1000
#: Reads see every row a replica acknowledged, wherever they land.
CONSISTENT_READ = " SETTINGS select_sequential_consistency = 1"


def cluster_profile() -> External | None:
    """The user's servers when both the URL and the cluster are set, else None (the tests skip).

    Read at import of a test module, so a skip is decided before any fixture starts.
    """
    ext = External.from_env()
    return ext if ext is not None and ext.cluster else None


def replicated_table_ddl(
    database: str, table: str, columns_sql: str, order_by: str, partition_by: str | None, cluster: str
) -> list[str]:
    """The statements creating ``database.table`` as a ``ReplicatedMergeTree`` on every host of
    ``cluster``, in order; pure.

    Every identifier is quoted; ``columns_sql``, ``order_by`` and ``partition_by`` are SQL
    written by the test. The macros of :data:`KEEPER_PATH` and ``{replica}`` are left for
    each server to fill in, and the table keeps :data:`DEDUP_WINDOW` blocks for mode dedup.
    """
    on_cluster = f" ON CLUSTER {quote_identifier(cluster)}"
    partition = f" PARTITION BY {partition_by}" if partition_by else ""
    return [
        f"CREATE DATABASE IF NOT EXISTS {quote_identifier(database)}{on_cluster}",
        f"CREATE TABLE {qualified(database, table)}{on_cluster} ({columns_sql}) "
        f"ENGINE = ReplicatedMergeTree('{KEEPER_PATH}', '{{replica}}'){partition} ORDER BY {order_by} "
        f"SETTINGS replicated_deduplication_window = {DEDUP_WINDOW}",
    ]


def drop_database_ddl(database: str, cluster: str) -> str:
    """``DROP DATABASE ... ON CLUSTER ... SYNC``: every host's tables and their Keeper nodes go at once; pure."""
    return f"DROP DATABASE IF EXISTS {quote_identifier(database)} ON CLUSTER {quote_identifier(cluster)} SYNC"


def stream_rows(ext: External, database: str, table: str = "events") -> list[tuple[int, int, str]]:
    """The ``(p, o, v)`` rows of a streaming test's target (:mod:`tests.helpers.spark_streams`),
    read with :data:`CONSISTENT_READ`."""
    out = ext.run(f"SELECT p, o, v FROM {qualified(database, table)}{CONSISTENT_READ} FORMAT TSV")
    return [(int(p), int(o), v) for p, o, v in (line.split("\t") for line in out.splitlines() if line)]


def assert_each_record_once(ext: External, database: str, expected: set[tuple[int, int, str]]) -> None:
    """The target holds every expected row once and nothing else (as
    :func:`tests.helpers.spark_streams.assert_exactly`, read without a transaction)."""
    rows = stream_rows(ext, database)
    assert len(rows) == len(set(rows)), f"duplicates in the target: {len(rows) - len(set(rows))}"
    missing, extra = expected - set(rows), set(rows) - expected
    assert not missing and not extra, f"{len(missing)} missing, {len(extra)} unexpected rows"
