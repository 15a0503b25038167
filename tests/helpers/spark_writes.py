"""Targets and reads of the Spark writer tests (batch and streaming) on the embedded stack.

Every read of a target is read-committed (``implicit_transaction=1``) unless the name
says otherwise; registry and system tables are not transactional and are read plainly.
"""

from __future__ import annotations

import requests

from spark_datasource.testing import credentials
from spark_datasource.testing.credentials import http_auth


def run_sql(url: str, text: str) -> str:
    """Run one statement on the server; raise with the server's message on error."""
    r = requests.post(url, data=text.encode(), timeout=120, auth=http_auth())
    if r.status_code != 200:
        raise RuntimeError(f"{text!r}: HTTP {r.status_code}: {r.text.strip()}")
    return r.text


def read_committed(url: str, select: str) -> list[list[str]]:
    """Rows (TSV cells) of ``select`` seen read-committed (``implicit_transaction=1``)."""
    out = run_sql(url, f"{select} SETTINGS implicit_transaction = 1 FORMAT TSV")
    return [line.split("\t") for line in out.splitlines() if line]


def scalar(url: str, select: str) -> int:
    return int(read_committed(url, select)[0][0])


def table_names(url: str, database: str) -> list[str]:
    # system tables are not transactional: a plain read
    out = run_sql(url, f"SELECT name FROM system.tables WHERE database = '{database}' ORDER BY name FORMAT TSV")
    return out.split()


def open_registry_entries(url: str, database: str) -> int:
    """Registry entries of ``database`` still INITIALIZED/COMMITTING/ABORTING (0 if no registry)."""
    if "clickhouse_tx_registry" not in table_names(url, database):
        return 0
    # KeeperMap is not transactional: a plain read
    return int(
        run_sql(
            url,
            f"SELECT count() FROM `{database}`.clickhouse_tx_registry "
            "WHERE lower(state) NOT IN ('committed', 'aborted') FORMAT TSV",
        )
    )


def writer_options(url: str, database: str, table: str, mode: str, **extra: str) -> dict[str, str]:
    """The writer's options for ``database.table`` in ``mode``, with the run's ``user``/``password`` if any."""
    # The test frames are nullable (casts, mapInArrow schemas) but never hold nulls.
    return {
        "url": url,
        "database": database,
        "table": table,
        "mode": mode,
        "allow_nullable_into_non_nullable": "true",
        **credentials.writer_options(),
        **extra,
    }


def create_events_table(url: str, database: str, table: str, mode: str, extra: str = "") -> None:
    """``(id Int64, k Int32, s String)``; with a dedup window when ``mode`` is dedup."""
    settings = " SETTINGS non_replicated_deduplication_window = 1000" if mode == "dedup" else ""
    run_sql(
        url,
        f"CREATE TABLE `{database}`.`{table}` (id Int64, k Int32, s String) "
        f"ENGINE = MergeTree {extra} ORDER BY id{settings}",
    )


def events(spark, n: int, partitions: int):
    return spark.range(0, n, 1, partitions).selectExpr(
        "id", "cast(id % 1000 as int) as k", "concat('r', cast(id as string)) as s"
    )


def expected_totals(n: int) -> tuple[int, int, int, int]:
    """(count, sum(id), sum(k), sum(length(s))) of :func:`events` (computed here, not by Spark)."""
    return (n, n * (n - 1) // 2, sum(i % 1000 for i in range(n)), sum(1 + len(str(i)) for i in range(n)))


def actual_totals(url: str, database: str, table: str) -> tuple[int, int, int, int]:
    row = read_committed(url, f"SELECT count(), sum(id), sum(k), sum(length(s)) FROM `{database}`.`{table}`")[0]
    return tuple(int(x) for x in row)  # type: ignore[return-value]


def resumable_job(
    spark, url: str, database: str, mode: str, n: int, parts: int, txn: str, log_dir: object, **extra: str
) -> None:
    """Write ids 0..n-1 of :func:`events` into ``events``, cut into ``parts`` partitions
    (``repartition``), as a resumable batch job (``transactional_id`` + ``decision_log``)."""
    (
        events(spark, n, 1)
        .repartition(parts)
        .write.format("clickhouse_tx")
        .options(
            **writer_options(url, database, "events", mode, transactional_id=txn, decision_log=str(log_dir), **extra)
        )
        .mode("append")
        .save()
    )
