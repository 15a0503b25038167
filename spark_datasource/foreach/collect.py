"""The ``foreachBatch`` helper's collect of a micro-batch to the driver, stopped at a size.

Classic Spark sends a DataFrame's rows to the Python driver as Arrow record batches over a
local socket (``Dataset.collectAsArrowToPython``, which ``DataFrame._collect_as_arrow``
reads): every batch as its task finishes, then their order. :func:`collect_arrow` reads
them the same way and adds up their bytes as they arrive; past ``limit_bytes`` it stops
reading and closes the socket, so a micro-batch too large for the driver is never held
whole (the helper then writes it from the executors, or refuses it). Spark Connect sends
the whole table at once (``toArrow``): the size is checked once it has arrived.
"""

from __future__ import annotations

import logging
from typing import IO, TYPE_CHECKING, Iterator

import pyarrow as pa

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

log = logging.getLogger("clickhouse_tx.spark.foreach_batch")


def _capped_serializer(limit_bytes: int):  # -> ArrowCollectSerializer (pyspark imported here only)
    from pyspark.sql.pandas.serializers import ArrowCollectSerializer, ArrowStreamSerializer

    class Capped(ArrowCollectSerializer):
        """``ArrowCollectSerializer`` that drops the batches once they pass ``limit_bytes``.

        It reads on to the end (``over``: the bytes seen, past the limit) rather than
        closing the socket: a collect cut short fails its Spark job, which logs errors.
        """

        over: int | None = None

        def load_stream(self, stream: IO[bytes]) -> Iterator[pa.RecordBatch]:
            batches: list[pa.RecordBatch] = []
            seen = 0
            for batch in ArrowStreamSerializer.load_stream(self, stream):
                seen += batch.nbytes
                if seen <= limit_bytes:
                    batches.append(batch)
                elif batches:
                    batches = []  # freed: the caller gets none of them
            order = _order(stream)
            if seen > limit_bytes:
                self.over = seen
                return
            for i in order:
                yield batches[i]

    return Capped()


def _order(stream: IO[bytes]) -> list[int]:
    """The batches' order, which the JVM sends after them (as ``ArrowCollectSerializer`` reads it)."""
    from pyspark.errors import PySparkRuntimeError
    from pyspark.serializers import UTF8Deserializer, read_int

    count = read_int(stream)
    if count == -1:
        raise PySparkRuntimeError(
            errorClass="ERROR_OCCURRED_WHILE_CALLING",
            messageParameters={"func_name": "collect_arrow", "error_msg": UTF8Deserializer().loads(stream)},
        )
    return [read_int(stream) for _ in range(count)]


def collect_arrow(df: "DataFrame", limit_bytes: int | None = None) -> list[pa.RecordBatch] | None:
    """The DataFrame's rows on the driver as Arrow record batches, or None past ``limit_bytes``.

    Driver, once per table of a micro-batch. With ``limit_bytes`` None, every row is
    collected. Otherwise, once the Arrow bytes received pass it, what was received is
    dropped and the rest is read without being kept: the caller writes the rows another way.
    """
    collect = getattr(df, "_collect_as_arrow", None)
    if collect is None:  # Spark Connect: the whole table arrives at once
        batches = df.toArrow().to_batches()
        return None if limit_bytes is not None and sum(b.nbytes for b in batches) > limit_bytes else batches
    if limit_bytes is None:
        return list(collect())
    return _collect_capped(df, limit_bytes)


def _collect_capped(df: "DataFrame", limit_bytes: int) -> list[pa.RecordBatch] | None:
    from pyspark.errors.exceptions.captured import unwrap_spark_exception
    from pyspark.traceback_utils import SCCallSiteSync
    from pyspark.util import _load_from_socket

    with SCCallSiteSync(df.sparkSession.sparkContext):
        port, secret, server = df._jdf.collectAsArrowToPython()
    capped = _capped_serializer(limit_bytes)
    with _load_from_socket((port, secret), capped) as stream:
        batches = list(stream)
    over = capped.over
    try:
        with unwrap_spark_exception():
            server.getResult()  # the JVM's error, if the job failed
    except Exception as exc:
        # Results past spark.driver.maxResultSize fail the job before they reach Python.
        if "maxResultSize" not in str(exc):
            raise
        over = -1
    if over is not None:
        log.debug("clickhouse_tx: collected %s bytes, over the limit %d: dropped", over, limit_bytes)
        return None
    return batches


__all__ = ["collect_arrow"]
