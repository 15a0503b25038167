"""The streaming job of the ``foreachBatch`` helper's kill tests, run as a child process.

``python -m tests.helpers.foreach_torture run <json args>``, started by
:func:`tests.helpers.torture.run_child` (``module=JOB``) in a session of its own: rows
``(p, o, v)`` of ``kafka_py`` (:func:`tests.helpers.cluster_job.kafka_rows`), trigger
``availableNow``, each micro-batch written by the exactly-once helper in ``mode``
(``transaction``, or ``dedup``: the target a table with a deduplication window):

- ``tables`` ``["events"]``: ``foreachBatch(clickhouse_tx_batch(...))`` into ``events``;
- ``tables`` ``["a", "b"]``: a function opening ``clickhouse_tx_transaction``, the even
  offsets into ``a`` and the odd ones into ``b``, in one transaction under one key row.

``fault`` (the options of :func:`tests.helpers.torture.kill_at`) SIGKILLs the process
group (driver Python, JVM, workers) once, at one of :data:`STEPS` of one micro-batch:

- ``after_insert:N``: inside the batch's transaction, once the N-th table's INSERT
  returned, before the next table's is sent (two tables);
- ``in_batch_transaction``: inside it, after every INSERT and the key row, just before COMMIT;
- ``before_key_row`` (``dedup``, or a micro-batch past ``driver_max_bytes``): every chunk
  inserted (visible), or the sink's batch job published, before the key row;
- ``after_commit``: the helper returned (its COMMIT or key row done), before Spark's
  commit log records the batch: a restart replays it.

``driver_max_bytes`` is the helper's (1: every micro-batch is written from the executors);
``helper_options`` more keyword options of the helper (e.g. ``session_timeout``).
``paced_s`` (mode ``transaction``): the helper's INSERTs send each record batch of the
micro-batch that many seconds after the one before (a slow driver: an INSERT's body
lasts long enough to be killed in its middle, :mod:`tests.helpers.insert_kill`).
``repartition`` (restarts): the micro-batch is repartitioned into that many partitions
before the helper gets it, so a replay's rows come in another order than the killed
attempt's (``dedup`` orders them by value).

The helper takes no ``fault.*`` option. The steps before ``after_commit`` fire in this
job's ``write_batch`` (``write_batch_dedup``), which it puts in place of the helper's in
this process only: the helper's own, given a ``before_commit`` (``before_key``) hook and
a hook before each next table's rows.
The job logs the helper's INFO lines (a skipped batch) to the file ``log``.

The helper runs with its default ``session_timeout`` (an hour): the transaction of an
attempt killed inside it is in the key's session, which the restart settles (ROLLBACK)
before it reads the key, so plain reads count every record once right after the restart.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from typing import Any, Callable, Iterable, Iterator, Sequence

import pyarrow as pa

from clickhouse_tx.foreach.keys import BatchKey, TableRows
from clickhouse_tx.interfaces import Hook, Target
from clickhouse_tx.testing.faults import FaultPlan, check_enabled

JOB = "tests.helpers.foreach_torture"
APP_ID = "kill-test"
#: The helper's steps where the tests kill the driver, in the order a micro-batch reaches them.
STEPS = ("after_insert:1", "in_batch_transaction", "after_commit")
#: The same in mode ``dedup``, where no transaction holds the rows.
DEDUP_STEPS = ("after_insert:1", "before_key_row", "after_commit")
#: The tables of a multi-table micro-batch, each with the parity of the offsets it takes.
SPLIT = {"a": 0, "b": 1}


def fault_plan(fault: dict[str, str] | None) -> FaultPlan | None:
    """The plan of ``fault`` (:func:`tests.helpers.torture.kill_at`'s options), None without one.

    Built here, not by :meth:`FaultPlan.parse`: ``after_insert`` is a step of the
    ``foreachBatch`` functions, not of the writer (as in :mod:`spark_datasource.testing.foreach_sinks`).
    """
    if not fault:
        return None
    check_enabled(fault)
    step, _, nth = fault["fault.step"].partition(":")
    return FaultPlan(
        step=step,
        action=fault.get("fault.action", "kill"),
        nth=int(nth or 1),
        batch=int(fault["fault.batch"]),
        once_file=fault["fault.once_file"],
    )


def _after(hook: Hook, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``batches``, once ``hook`` ran: when the INSERT that sends them asks for the first one."""
    hook()
    yield from batches


def _hooked(plan: FaultPlan, key: BatchKey, parts: Sequence[TableRows]) -> list[TableRows]:
    """``parts``, each after the first firing ``after_insert:N`` when its rows are first asked for."""

    def after_insert(n: int) -> Hook:
        return lambda: plan.hit("after_insert", key.batch_id, n)

    return [
        p if n == 0 else dataclasses.replace(p, batches=_after(after_insert(n), p.batches)) for n, p in enumerate(parts)
    ]


def faulty_write_batch(plan: FaultPlan) -> Callable[..., int]:
    """The helper's ``write_batch`` firing ``plan`` after each table's INSERT and before the COMMIT."""
    from clickhouse_tx.foreach import keys as batch_keys

    def write_batch(
        target: Target, key: BatchKey, parts: Sequence[TableRows], before_commit: Hook | None = None
    ) -> int:
        return batch_keys.write_batch(
            target,
            key,
            _hooked(plan, key, parts),
            before_commit=lambda: plan.hit("in_batch_transaction", key.batch_id),
        )

    return write_batch


def _paced(delay_s: float, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``batches``, each ``delay_s`` seconds after the one before (and the first after ``delay_s``)."""
    for b in batches:
        time.sleep(delay_s)
        yield b


def paced_write_batch(delay_s: float, write: Callable[..., int]) -> Callable[..., int]:
    """``write`` (the helper's ``write_batch``) with each table's rows :func:`_paced`."""

    def write_batch(target: Target, key: BatchKey, parts: Sequence[TableRows], **more: Any) -> int:
        return write(target, key, [dataclasses.replace(p, batches=_paced(delay_s, p.batches)) for p in parts], **more)

    return write_batch


def faulty_write_batch_dedup(plan: FaultPlan) -> Callable[..., int]:
    """The helper's ``write_batch_dedup`` firing ``plan`` after each table's chunks and before the key row."""
    from clickhouse_tx.foreach import dedup as batch_dedup

    def write_batch_dedup(target: Target, key: BatchKey, parts: Sequence[TableRows], **_: Any) -> int:
        return batch_dedup.write_batch_dedup(
            target, key, _hooked(plan, key, parts), before_key=lambda: plan.hit("before_key_row", key.batch_id)
        )

    return write_batch_dedup


def faulty_write_from_executors(plan: FaultPlan) -> Callable[..., int]:
    """The helper's ``write_from_executors`` firing ``plan`` after the batch job, before the key row."""
    from spark_datasource.foreach import helper as foreach

    real = foreach.write_from_executors

    def write_from_executors(df: Any, options: Any, target: Target, key: BatchKey) -> int:
        return real(df, options, target, key, before_key=lambda: plan.hit("before_key_row", key.batch_id))

    return write_from_executors


def micro_batch_function(args: dict[str, Any], plan: FaultPlan | None) -> Callable[[Any, int], None]:
    """The ``foreachBatch`` function of the job: the helper into ``args["tables"]``, then ``after_commit``."""
    from spark_datasource import clickhouse_tx_batch, clickhouse_tx_transaction
    from spark_datasource.testing.credentials import writer_options

    url, database = args["url"], args["database"]
    options: dict[str, Any] = {
        "allow_nullable_into_non_nullable": True,
        "mode": args.get("mode", "transaction"),
        **({"driver_max_bytes": args["driver_max_bytes"]} if args.get("driver_max_bytes") else {}),
        **writer_options(),
        **args.get("helper_options", {}),
    }
    parts = args.get("repartition")
    single = None
    if args["tables"] == ["events"]:
        single = clickhouse_tx_batch(url=url, table=f"{database}.events", app_id=APP_ID, **options)
    # ``two_helpers``: one helper call per table under one app_id (not one context), with the
    # step ``between_helpers`` after the first: the keys are (app_id, batch_id, tables).
    helpers = {
        table: clickhouse_tx_batch(url=url, table=f"{database}.{table}", app_id=APP_ID, **options)
        for table in (SPLIT if args.get("two_helpers") else ())
    }

    def write(df: Any, batch_id: int) -> None:
        if parts:
            df = df.repartition(int(parts))
        if single is not None:
            single(df, batch_id)
        elif helpers:
            for n, (table, parity) in enumerate(SPLIT.items()):
                if n and plan is not None:
                    plan.hit("between_helpers", batch_id)
                helpers[table](df.where(f"o % 2 = {parity}"), batch_id)
        else:
            with clickhouse_tx_transaction(
                url=url, app_id=APP_ID, batch_id=batch_id, database=database, **options
            ) as tx:
                for table, parity in SPLIT.items():
                    tx.insert(table, df.where(f"o % 2 = {parity}"))
        if plan is not None:
            plan.hit("after_commit", batch_id)

    return write


def run(args: dict[str, Any]) -> None:
    """The job (child process): drain the topic through the helper, then exit 0."""
    from spark_datasource.foreach import helper as foreach
    from spark_datasource.foreach import write as foreach_batch
    from tests.helpers.cluster_job import kafka_rows
    from tests.helpers.torture import MAX_OFFSETS, spark_session

    log = logging.getLogger(foreach_batch.log.name)
    log.setLevel(logging.INFO)
    log.addHandler(logging.FileHandler(args["log"]))
    spark = spark_session(args)
    plan = fault_plan(args.get("fault"))
    if plan is not None:
        foreach_batch.write_batch = faulty_write_batch(plan)  # type: ignore[assignment]
        foreach_batch.write_batch_dedup = faulty_write_batch_dedup(plan)  # type: ignore[assignment]
        foreach.write_from_executors = faulty_write_from_executors(plan)  # type: ignore[assignment]
    if args.get("paced_s"):
        foreach_batch.write_batch = paced_write_batch(float(args["paced_s"]), foreach_batch.write_batch)  # type: ignore[assignment]
    query = (
        kafka_rows(spark, {"max_offsets": MAX_OFFSETS, **args})
        .writeStream.foreachBatch(micro_batch_function(args, plan))
        .option("checkpointLocation", args["chk"])
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(json.loads(sys.argv[2]))
    else:
        raise SystemExit(f"unknown command {sys.argv[1]!r}")
