"""``kafka_py``: a Kafka source for Spark written with the Python Data Source API.

Batch (``spark.read.format("kafka_py")``) and streaming (``spark.readStream``) reads
of Kafka through kafka-python 2.3.x. Rows have Spark's Kafka source schema::

    key binary, value binary, topic string, partition int, offset long,
    timestamp timestamp, timestampType int[, headers array<struct<key:string,value:binary>>]

(``headers`` only with ``includeHeaders=true``, as in Spark.)

With ``value.format=json`` and ``value.schema``, ``value`` is instead the struct of
the schema's fields, decoded from each record's JSON object on the executor
(:mod:`spark_datasource.kafka.json_values`).

This module holds the Spark classes and the Spark schema; pyspark is imported here
only. The rest of the source is in

- :mod:`spark_datasource.kafka.offsets`: offset planning (pure: offsets in the
  checkpoint, micro-batch ends, Spark partitions);
- :mod:`spark_datasource.kafka.consumers`: broker access, the driver's metadata and
  the executors' consumer pool;
- :mod:`spark_datasource.kafka.fetch`: the executors' read of a planned range;
- :mod:`spark_datasource.kafka.arrow`: records to Arrow record batches;
- :mod:`spark_datasource.kafka.options`, :mod:`spark_datasource.kafka.security`,
  :mod:`spark_datasource.kafka.errors`: options, TLS/SASL, errors.

Offsets are plain JSON ``{"topic": {"partition": next_offset}}`` with topics and
partitions in a fixed order. Spark stores them in the checkpoint, and
:meth:`KafkaStreamReader.partitions` is a pure function of (start, end, options)
(:func:`spark_datasource.kafka.offsets.plan_partitions`), so a micro-batch replayed
after a crash reads exactly the same records split into exactly the same Spark
partitions: the property the clickhouse_tx sink's exactly-once argument needs
(`docs/design.md` §5).

Where things run
----------------
- :class:`KafkaDataSource` ``__init__``: driver, when the DataFrame is defined; parses
  the options (errors name the option).
- :class:`KafkaStreamReader` ``initialOffset/latestOffset/partitions/commit``: driver,
  in one long-lived Python worker per query; it keeps one metadata consumer open.
- ``read(partition)``: executors, once per offset range per micro-batch; builds Arrow
  record batches from each fetch (one list per column, no per-row objects beyond
  what kafka-python itself creates). Everything it needs is in the picklable reader
  and the :class:`KafkaInputPartition`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Iterator, Mapping

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_datasource import worker_gc
from spark_datasource.kafka.consumers import ClusterMetadata
from spark_datasource.kafka.fetch import read_partition
from spark_datasource.kafka.json_values import ValueFields
from spark_datasource.kafka.offsets import (
    START_KEY,
    TP,
    PlannedPartition,
    from_json_offsets,
    plan_end_offsets,
    plan_partitions,
    resolve_bound,
    to_json_offsets,
)
from spark_datasource.kafka.options import KafkaOptions, parse_kafka_options

# Kafka never leaves topic, partition, offset or timestamp empty: declaring them
# non-nullable lets them land in non-Nullable ClickHouse columns without an override.
SCHEMA = StructType(
    [
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("timestamp", TimestampType(), False),
        StructField("timestampType", IntegerType(), False),
        StructField(
            "headers",
            ArrayType(
                StructType(
                    [
                        StructField("key", StringType(), True),
                        StructField("value", BinaryType(), True),
                    ]
                ),
                True,
            ),
            True,
        ),
    ]
)


def source_schema(value_fields: ValueFields | None = None, include_headers: bool = True) -> StructType:
    """:data:`SCHEMA`, with ``value`` the struct of ``value_fields`` when they are given
    (``value.format=json``), without ``headers`` unless ``include_headers`` (as Spark's
    source: the column is there only with ``includeHeaders=true``)."""
    if value_fields is None and include_headers:
        return SCHEMA
    fields = [f for f in SCHEMA.fields if include_headers or f.name != "headers"]
    if value_fields is None:
        return StructType(fields)
    return StructType(
        [StructField(f.name, spark_value_type(value_fields), True) if f.name == "value" else f for f in fields]
    )


def spark_value_type(fields: ValueFields) -> StructType:
    """The Spark type of the decoded ``value`` column (``value.format=json``).

    The canonical type names of ``value.schema`` (:func:`spark_datasource.kafka.json_values.parse_value_schema`)
    are Spark's own JSON names of its types, so Spark builds each field's type.
    """
    return StructType.fromJson(
        {
            "type": "struct",
            "fields": [{"name": name, "type": t, "nullable": True, "metadata": {}} for name, t in fields],
        }
    )


@dataclasses.dataclass(frozen=True)
class KafkaInputPartition(InputPartition):
    """One Spark partition: the offset range, or group of ranges, one task reads.

    Built on the driver by the readers' ``partitions()`` from the pure plan
    (:func:`spark_datasource.kafka.offsets.plan_partitions`), pickled to an executor.
    """

    planned: PlannedPartition


class KafkaBatchReader(DataSourceReader):
    """``spark.read.format("kafka_py")``: records from startingOffsets to endingOffsets.

    ``partitions()`` runs on the driver; the reader is pickled to executors for
    ``read()``.
    """

    def __init__(self, opts: KafkaOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[KafkaInputPartition]:
        meta = ClusterMetadata(self.opts)
        try:
            tps = meta.topic_partitions()
            earliest, latest = meta.earliest(tps), meta.latest(tps)
            lookup = meta.offsets_for_times
            start = resolve_bound(self.opts, tps, earliest, latest, lookup, starting=True)
            end = resolve_bound(self.opts, tps, earliest, latest, lookup, starting=False)
        finally:
            meta.close()
        return [KafkaInputPartition(p) for p in plan_partitions(start, end, self.opts)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Executor, once per Spark partition and task attempt, in a reused Python worker."""
        worker_gc.before_task()
        assert isinstance(partition, KafkaInputPartition)
        return read_partition(self.opts, partition.planned)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("kafka_py")``.

    Driver methods run in one Python worker that lives as long as the query;
    ``read`` runs on executors with a pickled copy (it uses only ``opts``).
    """

    def __init__(self, opts: KafkaOptions) -> None:
        self.opts = opts
        self._meta: ClusterMetadata | None = None
        self._available_now: dict[TP, int] | None = None
        self._last_latest: dict[TP, int] | None = None
        self._initial: dict[str, Any] | None = None
        # As Spark's source: the first trigger after a (re)start is never delayed.
        self._last_trigger = float("-inf")
        self._clock: Callable[[], float] = time.monotonic

    def __getstate__(self) -> dict[str, Any]:
        # Executors need only the options; never ship a live consumer.
        return {"opts": self.opts, "_meta": None, "_available_now": None, "_last_latest": None, "_initial": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._last_trigger, self._clock = float("-inf"), time.monotonic

    def _m(self) -> ClusterMetadata:
        if self._meta is None:
            self._meta = ClusterMetadata(self.opts)
        return self._meta

    def initialOffset(self) -> dict[str, Any]:
        """Offsets a new query starts from (driver, once per new checkpoint)."""
        m = self._m()
        tps = m.topic_partitions()
        start = resolve_bound(self.opts, tps, m.earliest(tps), m.latest(tps), m.offsets_for_times, starting=True)
        self._initial = to_json_offsets(start)
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """End offsets of the next micro-batch (driver, once per trigger)."""
        begin = from_json_offsets(start)
        m = self._m()
        if self._available_now is not None:
            latest = dict(self._available_now)
        else:
            latest = m.latest(m.topic_partitions())
            self._last_latest = latest
        if self._delayed(begin, latest):
            return start
        earliest = m.earliest(sorted(tp for tp in latest if tp not in begin))
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = plan_end_offsets(begin, latest, earliest, max_rows, self.opts.fail_on_data_loss)
        if isinstance(limit, ReadMinRows):
            avail = sum(max(0, end[tp] - begin.get(tp, end[tp])) for tp in end)
            if avail < limit.min_rows:
                return start
        if end == begin:
            return start  # nothing new: the very offsets Spark gave, so it runs no batch
        out: dict[str, Any] = to_json_offsets(end)
        if start == self._initial:
            # The first batch: Spark logs only its end, and a replay of it starts from a
            # new initialOffset(), which "latest" or a timestamp may resolve elsewhere.
            out[START_KEY] = to_json_offsets(begin)
        return out

    def _delayed(self, begin: Mapping[TP, int], latest: Mapping[TP, int]) -> bool:
        """``minOffsetsPerTrigger``/``maxTriggerDelay``, as Spark's source: skip this trigger
        while fewer new records than the minimum exist, unless ``maxTriggerDelay`` has passed
        since the last batch (driver, once per trigger; never under ``availableNow``)."""
        low = self.opts.min_offsets_per_trigger
        if not low or self._available_now is not None:
            return False
        now = self._clock()
        waited_ms = (now - self._last_trigger) * 1000
        new_records = sum(off - begin.get(tp, 0) for tp, off in latest.items())
        if waited_ms < self.opts.max_trigger_delay_ms and new_records < low:
            return True
        self._last_trigger = now
        return False

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return to_json_offsets(self._last_latest) if self._last_latest is not None else None

    def prepareForTriggerAvailableNow(self) -> None:
        """Freeze the target offsets for ``trigger(availableNow=True)`` (driver, once)."""
        m = self._m()
        self._available_now = m.latest(m.topic_partitions())

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[KafkaInputPartition]:
        """Offset ranges of one micro-batch (driver; pure, so a replay plans the same).

        The first batch's start is the one logged in its end (:data:`START_KEY`), not
        the ``start`` Spark passes: on a replay that is a fresh ``initialOffset()``.
        """
        begin = from_json_offsets(end[START_KEY]) if START_KEY in end else from_json_offsets(start)
        return [KafkaInputPartition(p) for p in plan_partitions(begin, from_json_offsets(end), self.opts)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Executor, once per Spark partition and task attempt, in a reused Python worker."""
        worker_gc.before_task()
        assert isinstance(partition, KafkaInputPartition)
        return read_partition(self.opts, partition.planned)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the consumed offsets live in Spark's checkpoint, not in Kafka."""

    def stop(self) -> None:
        if self._meta is not None:
            self._meta.close()
            self._meta = None


class KafkaDataSource(DataSource):
    """The ``kafka_py`` format. Register with ``spark.dataSource.register(KafkaDataSource)``.

    Constructed on the driver when a DataFrame is defined (options are validated
    there) and pickled to the workers that plan and read.
    """

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.kafka_options = parse_kafka_options(options)

    @classmethod
    def name(cls) -> str:
        return "kafka_py"

    def schema(self) -> StructType:
        return source_schema(self.kafka_options.value_fields, self.kafka_options.include_headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaBatchReader(parse_kafka_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(parse_kafka_options(self.options, streaming=True))
