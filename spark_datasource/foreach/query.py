"""Which streaming query and run a ``foreachBatch`` micro-batch comes from, and what the helper
remembers of the run (driver, per process).

:func:`query_identity` names the query a key row records: its id is kept in the
checkpoint, so a query on a new checkpoint is told apart.

Spark replays at most one micro-batch per run of a query: the first, when the offset
log holds a batch the commit log does not. Every later batch of the run is new, since
Spark plans batch ``n + 1`` only after batch ``n`` is in the commit log, and a
``foreachBatch`` function that raises ends the run. So once a run has written (or
skipped) batch ``n`` in this process, its batch ``n + 1`` has no earlier attempt to
settle and no key row to find: :meth:`RunMemory.follows` lets the helper skip those
reads, and the table checks of the run's first batch hold for the run, as the sink's
checks at a query's start hold for its run. A restart is a new run (Spark's
``runId``), checked in full again. The memory is one per key of a batch (``app_id`` and
the tables a call writes), so two calls of one batch into other tables each have their
own; a second call of one batch under the same key (the run's last batch again) is no
replay, and the helper refuses it.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import threading
from typing import TYPE_CHECKING, Sequence

from clickhouse_tx.conversion.convert import ConversionPlan
from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.ids import canonical_location
from clickhouse_tx.store.query_identity import spark_query_id

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

#: The local property Spark sets to the streaming query's id while it runs a micro-batch.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
#: Runs remembered per process: a driver runs a few queries, each restarted now and then.
MAX_RUNS = 64


@dataclasses.dataclass
class RunMemory:
    """One run's state: the batch it last wrote or skipped, its checked tables."""

    last_batch: int | None = None
    key_table_ready: bool = False
    #: (database, table, Spark schema JSON) -> the plan its first batch checked.
    plans: dict[tuple[str, str, str], ConversionPlan] = dataclasses.field(default_factory=dict)

    def follows(self, batch_id: int) -> bool:
        """True when ``batch_id`` comes right after the run's last written or skipped batch."""
        return self.last_batch is not None and batch_id == self.last_batch + 1

    def done(self, batch_id: int) -> None:
        """The batch is written or skipped."""
        self.last_batch = batch_id

    def failed(self) -> None:
        """The batch raised: the next call checks in full (the run ends with the error anyway)."""
        self.last_batch = None


_RUNS: collections.OrderedDict[tuple[str, ...], RunMemory] = collections.OrderedDict()
_LOCK = threading.Lock()


def run_memory(
    spark: "SparkSession | None", query_id: str, app_id: str, url: str, database: str, tables: Sequence[str] = ()
) -> RunMemory | None:
    """The memory of the running query's run for ``app_id`` and ``tables`` (one key of each
    batch) into ``url``/``database``; None when no run is known (called outside a running
    query, or on Spark Connect)."""
    run_id = running_run_id(spark, query_id)
    if run_id is None:
        return None
    key = (run_id, app_id, url, database, *tables)
    with _LOCK:
        memory = _RUNS.pop(key, None) or RunMemory()
        _RUNS[key] = memory
        while len(_RUNS) > MAX_RUNS:
            _RUNS.popitem(last=False)
    return memory


def running_run_id(spark: "SparkSession | None", query_id: str) -> str | None:
    """The run id of the active streaming query ``query_id`` (a new one at each start), or None.

    Spark sets no local property for it; the query manager knows it. The active session's
    manager lists the query while its micro-batch runs; the micro-batch's own session, a
    clone, is asked only when there is no active one (one py4j round trip in the usual case).
    """
    from pyspark.sql import SparkSession

    for session in (SparkSession.getActiveSession(), spark):
        try:
            query = session.streams.get(query_id) if session is not None else None
        except Exception:  # Spark Connect, or a session being stopped: every step is taken
            query = None
        if query is not None:
            return str(query.runId)
    return None


def _running_query_id(spark: "SparkSession | None") -> str | None:
    """The id of the streaming query running this micro-batch, or None (not inside one)."""
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
    if spark is None:
        return None
    try:
        value = spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
    except Exception:  # Spark Connect has no SparkContext: checkpoint_location tells instead
        return None
    return value or None


def query_identity(spark: "SparkSession | None", checkpoint_location: str | None) -> tuple[str, str]:
    """``(query id, canonical checkpoint or '')`` of the micro-batch being written (driver).

    Raises
    ------
    ConfigurationError
        No query is known (neither running nor given), the checkpoint has no Spark
        metadata, or it belongs to another query than the running one.
    """
    running = _running_query_id(spark)
    if checkpoint_location is None:
        if running is None:
            raise ConfigurationError(
                "the foreachBatch helper cannot tell which streaming query this batch comes from "
                "(not called by a running query's foreachBatch, or on Spark Connect): give it "
                "checkpoint_location, the query's checkpointLocation"
            )
        return running, ""
    where = canonical_location(checkpoint_location, os.getcwd())
    try:
        stored = spark_query_id(where)
    except ConfigurationError as exc:
        raise ConfigurationError(f"option checkpoint_location={checkpoint_location!r}: {exc.message}") from None
    if running is not None and running != stored:
        raise ConfigurationError(
            f"option checkpoint_location={checkpoint_location!r} is the checkpoint of query {stored}, but "
            f"this micro-batch comes from query {running}: give the running query's own checkpointLocation"
        )
    return stored, where


__all__ = ["RunMemory", "query_identity", "run_memory", "running_run_id"]
