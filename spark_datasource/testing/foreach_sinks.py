"""The ``foreachBatch`` sinks of the streaming job: what users write without the writer, and the helper.

``foreach_insert`` and ``foreach_connect`` write every micro-batch at least once: a batch
replayed after a crash between its INSERT and Spark's commit log is inserted again.
``foreach_insert`` is a plain HTTP INSERT of Arrow (a diagnostic without the writer);
``foreach_connect`` is clickhouse-connect's ``insert_arrow`` of ``toArrow()``, today's
practice, which :mod:`benchmarks.peers` compares with the writer. ``foreach_tx`` is the
exactly-once helper :func:`~spark_datasource.foreach.helper.clickhouse_tx_batch`: a
replayed batch is skipped.
"""

from __future__ import annotations

from typing import Any, Callable

from clickhouse_tx.testing.faults import FaultPlan, check_enabled
from spark_datasource.testing import credentials
from spark_datasource.testing.credentials import http_auth

#: ``--sink``: ``clickhouse_tx`` (the writer), or a ``foreachBatch`` function writing each
#: micro-batch at least once: ``foreach_insert`` (a plain HTTP INSERT of Arrow, a diagnostic
#: without the writer) or ``foreach_connect`` (clickhouse-connect's ``insert_arrow`` of
#: ``toArrow()``: what users do today, :mod:`benchmarks.peers` compares it with the writer),
#: or ``foreach_tx`` (the exactly-once helper ``clickhouse_tx_batch``).
SINKS = ("clickhouse_tx", "foreach_insert", "foreach_connect", "foreach_tx")
#: ``--fault-step`` of a ``foreachBatch`` sink: the driver killed once a batch's INSERT
#: returned, before Spark's commit log records the batch (the window of its duplicates).
FOREACH_FAULT_STEP = "after_insert"


def foreach_batch(
    sink: str, url: str, table: str, fault_step: str | None, fault_batch: str | None, once_file: str | None
) -> Callable[[Any, int], None]:
    """The foreachBatch function of ``sink`` into ``table`` (driver, once per query start).

    ``fault_step`` ``after_insert`` (test-only: refused without
    ``CLICKHOUSE_TX_TEST_FAULTS=1``) SIGKILLs the driver once a batch's INSERT returned,
    at batch ``fault_batch`` or the first, once per ``once_file``.

    Raises
    ------
    ValueError
        Another ``fault_step`` (the writer's steps do not exist here), or ``sink`` unknown.
    """
    fault = None
    if fault_step is not None:
        if fault_step != FOREACH_FAULT_STEP:
            raise ValueError(f"--fault-step of --sink {sink}: only {FOREACH_FAULT_STEP} (got {fault_step!r})")
        check_enabled(["fault.step"])
        batch = int(fault_batch) if fault_batch is not None else None
        fault = FaultPlan(step=FOREACH_FAULT_STEP, action="kill", batch=batch, once_file=once_file)
    if sink == "foreach_insert":
        return _plain_insert(url, table, fault)
    if sink == "foreach_connect":
        return _connect_insert(url, table, fault)
    if sink == "foreach_tx":
        return _helper_insert(url, table, fault)
    raise ValueError(f"not a foreachBatch sink: {sink!r} (one of {', '.join(SINKS[1:])})")


def _after_insert(fault: FaultPlan | None, batch_id: int) -> None:
    if fault is not None:
        fault.hit(FOREACH_FAULT_STEP, batch_id)


def _plain_insert(url: str, table: str, fault: FaultPlan | None = None):
    """foreachBatch function: INSERT the batch as Arrow over HTTP (driver, once per batch)."""
    import pyarrow as pa
    import requests

    from clickhouse_tx.client.sql import qualified, split_table

    sql = f"INSERT INTO {qualified(*split_table(table))} FORMAT ArrowStream"

    def insert(batch_df, batch_id: int) -> None:
        tbl = batch_df.toArrow()
        if tbl.num_rows == 0:
            return
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, tbl.schema) as wr:
            wr.write_table(tbl)
        r = requests.post(
            url.rstrip("/") + "/",
            params={"query": sql},
            data=sink.getvalue().to_pybytes(),
            timeout=300,
            auth=http_auth(),
        )
        if r.status_code != 200:
            raise RuntimeError(f"batch {batch_id}: INSERT into {table} failed: {r.text.strip()[:500]}")
        _after_insert(fault, batch_id)

    return insert


def _connect_insert(url: str, table: str, fault: FaultPlan | None = None):
    """foreachBatch function: clickhouse-connect's ``insert_arrow`` of the batch (driver, once per batch).

    Today's practice without the writer: at least once (a batch replayed after a crash
    between the insert and Spark's commit log is inserted again). One client per driver
    process, made at the first batch.
    """
    from clickhouse_tx.client.sql import split_table

    db, t = split_table(table)
    client: list[Any] = []

    def insert(batch_df, batch_id: int) -> None:
        tbl = batch_df.toArrow()
        if tbl.num_rows == 0:
            return
        if not client:
            import clickhouse_connect

            login = credentials.clickhouse_connect_login()
            client.append(
                clickhouse_connect.get_client(
                    dsn=url, username=login.get("username"), password=login.get("password", "")
                )
            )
        client[0].insert_arrow(t, tbl, database=db)
        _after_insert(fault, batch_id)

    return insert


def _helper_insert(url: str, table: str, fault: FaultPlan | None = None):
    """foreachBatch function: the exactly-once helper, keyed by ``(table, batch_id)`` (driver, once per batch).

    The fault ``after_insert`` fires once the helper's transaction committed, before
    Spark's commit log records the batch: the replay finds the key and skips the batch.
    """
    from spark_datasource.foreach.helper import clickhouse_tx_batch

    write = clickhouse_tx_batch(
        url=url, table=table, app_id=f"foreach_tx-{table}", allow_nullable_into_non_nullable="true",
        **credentials.writer_options(),
    )  # fmt: skip

    def insert(batch_df, batch_id: int) -> None:
        write(batch_df, batch_id)
        _after_insert(fault, batch_id)

    return insert
