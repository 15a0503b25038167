"""``kafka_py``: a Kafka source for Spark written with the Python Data Source API.

Batch (``spark.read.format("kafka_py")``) and streaming (``spark.readStream``) reads
of Kafka through kafka-python 2.3.x. Rows have Spark's Kafka source schema::

    key binary, value binary, topic string, partition int, offset long,
    timestamp timestamp, timestampType int[, headers array<struct<key:string,value:binary>>]

(``headers`` only with ``includeHeaders=true``, as in Spark.)

With ``value.format=json`` and ``value.schema``, ``value`` is instead the struct of
the schema's fields, decoded from each record's JSON object on the executor
(:mod:`spark_datasource.kafka_json`).

Offsets are plain JSON ``{"topic": {"partition": next_offset}}`` with topics and
partitions in a fixed order. Spark stores them in the checkpoint, and
:meth:`KafkaStreamReader.partitions` is a pure function of (start, end, options), so a
micro-batch replayed after a crash reads exactly the same records split into exactly
the same Spark partitions: the property the clickhouse_tx sink's exactly-once argument
needs (`docs/design.md` §5).

Where things run
----------------
- :class:`KafkaDataSource` ``__init__``: driver, when the DataFrame is defined; parses
  the options (errors name the option).
- :class:`KafkaStreamReader` ``initialOffset/latestOffset/partitions/commit``: driver,
  in one long-lived Python worker per query; it keeps one metadata consumer open.
- ``read(partition)``: executors, once per offset range per micro-batch; builds Arrow
  record batches from each fetch (one list per column, no per-row objects beyond
  what kafka-python itself creates). Everything it needs is in the picklable reader
  and the :class:`KafkaOffsetRange`.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import hashlib
import logging
import re
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar, cast

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

from clickhouse_tx.errors import ClickHouseTxError, ConfigurationError
from spark_datasource import worker_gc
from spark_datasource.kafka_json import ValueFields, arrow_value_type, decode_values, spark_value_type
from spark_datasource.kafka_offset_parsers import EARLIEST, LATEST
from spark_datasource.kafka_options import KafkaOptions, parse_kafka_options
from spark_datasource.kafka_security import check_access, redact_secrets_in_logs

log = logging.getLogger(__name__)

TP = tuple[str, int]
T = TypeVar("T")

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


class KafkaSourceError(ClickHouseTxError):
    """Base of the errors raised by the ``kafka_py`` source."""


class KafkaUnavailableError(KafkaSourceError):
    """The brokers in ``bootstrap.servers`` did not answer within the bounded retries."""


class KafkaDataLossError(KafkaSourceError):
    """Records of a planned offset range are gone (retention, deleted topic/partition).

    Raised only with ``failOnDataLoss=true`` (the default).
    """


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


@functools.lru_cache(maxsize=8)
def arrow_schema(value_fields: ValueFields | None = None, include_headers: bool = True) -> pa.Schema:
    """The Arrow schema Spark expects for :func:`source_schema` (checked field by field).

    Spelled out in pyarrow rather than derived with ``pyspark.sql.pandas.types``, whose
    import pulls in pandas: about a second of every fresh Python worker's first read
    (a test checks the two agree).
    """
    header = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
    value = pa.binary() if value_fields is None else arrow_value_type(value_fields)
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", value),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("timestampType", pa.int32(), nullable=False),
    ]
    if include_headers:
        fields.append(pa.field("headers", pa.list_(pa.field("element", header))))
    return pa.schema(fields)


# ------------------------------------------------------------------ pure planning


@dataclasses.dataclass(frozen=True)
class KafkaOffsetRange(InputPartition):
    """One Spark partition: records ``[start, end)`` of one topic-partition.

    Built on the driver by :func:`plan_ranges`, pickled to an executor.
    """

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def to_json_offsets(offsets: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    """Offsets as Spark stores them: topics sorted, partitions in numeric order.

    Spark compares offsets as JSON text, so the order must never depend on how
    the dict was built.
    """
    out: dict[str, dict[str, int]] = {}
    for topic, part in sorted(offsets):
        out.setdefault(topic, {})[str(part)] = int(offsets[(topic, part)])
    return out


#: Key of the first micro-batch's end offset that holds the batch's start (``$`` is no
#: topic name character): Spark replays batch 0 from a fresh ``initialOffset()``.
START_KEY = "$start"


def from_json_offsets(doc: Mapping[str, Any]) -> dict[TP, int]:
    """Inverse of :func:`to_json_offsets` (:data:`START_KEY` left out)."""
    return {(t, int(p)): int(o) for t, parts in doc.items() if t != START_KEY for p, o in parts.items()}


def limit_offsets(start: Mapping[TP, int], latest: Mapping[TP, int], max_rows: int) -> dict[TP, int]:
    """Cap the advance from ``start`` to ``latest`` at ``max_rows`` records in total.

    Each topic-partition gets a share proportional to its backlog (largest
    remainders break ties, then topic-partition order), so a busy partition
    cannot starve the others and the result depends only on the inputs.
    """
    lag = {tp: max(0, latest[tp] - start.get(tp, latest[tp])) for tp in latest}
    total = sum(lag.values())
    if total <= max_rows:
        return dict(latest)
    shares = {tp: lag[tp] * max_rows // total for tp in lag}
    left = max_rows - sum(shares.values())
    order = sorted(lag, key=lambda tp: (-((lag[tp] * max_rows) % total), tp))
    for tp in order:
        if left == 0:
            break
        if shares[tp] < lag[tp]:
            shares[tp] += 1
            left -= 1
    return {tp: (start[tp] + shares[tp]) if tp in start else latest[tp] for tp in latest}


def plan_end_offsets(
    start: Mapping[TP, int],
    latest: Mapping[TP, int],
    earliest: Mapping[TP, int],
    max_rows: int | None,
    fail_on_data_loss: bool,
) -> dict[TP, int]:
    """The end offsets of the next micro-batch (driver, once per trigger).

    - A topic-partition that is new (not in ``start``) enters at its earliest
      offset with an empty range; it is read from the next batch on. So every
      range a batch reads has an explicit start in the checkpoint, and a replay
      never depends on what "earliest" means at replay time.
    - One that disappeared (topic deleted) is a data loss: raise, or drop it.
    - Then at most ``max_rows`` records in total (``maxOffsetsPerTrigger``).
    """
    gone = sorted(tp for tp in start if tp not in latest)
    if gone and fail_on_data_loss:
        raise KafkaDataLossError(
            f"topic-partitions {_fmt_tps(gone)} disappeared (topic deleted?); records after "
            f"the checkpointed offsets may be lost. Set failOnDataLoss=false to skip them."
        )
    late = sorted(tp for tp in latest if tp not in start and earliest[tp] != 0)
    if late:
        # As Spark: a partition that appears with records already deleted lost them.
        lost = ", ".join(f"{t}[{p}] starts at {earliest[(t, p)]}" for t, p in late)
        if fail_on_data_loss:
            raise KafkaDataLossError(
                f"added partitions do not start at offset 0 ({lost}): their first records were "
                f"deleted before this query saw them. Set failOnDataLoss=false to skip them."
            )
        log.warning("kafka_py: added partitions do not start at offset 0 (%s); reading from there", lost)
    known = {tp: latest[tp] for tp in latest if tp in start}
    end = dict(known) if max_rows is None else limit_offsets(start, known, max_rows)
    for tp in latest:
        if tp not in start:
            end[tp] = earliest[tp]
    return end


def plan_ranges(
    start: Mapping[TP, int],
    end: Mapping[TP, int],
    min_partitions: int | None,
    fail_on_data_loss: bool,
    max_records: int | None = None,
) -> list[KafkaOffsetRange]:
    """Spark partitions for records ``[start, end)`` (driver; deterministic).

    One range per topic-partition with records; as Spark's source, each range is then
    cut into ``ceil(size / max_records)`` near-equal pieces (``maxRecordsPerPartition``),
    and the pieces further when ``min_partitions`` asks for more partitions than that
    (each range gets pieces in proportion to its size).
    """
    ranges: list[KafkaOffsetRange] = []
    for tp in sorted(end):
        if tp not in start:
            continue  # first seen in this batch: its range starts in the next one
        s, e = start[tp], end[tp]
        if e < s:
            if fail_on_data_loss:
                raise KafkaDataLossError(
                    f"{tp[0]}[{tp[1]}]: end offset {e} is below the checkpointed offset {s} "
                    f"(topic re-created or truncated?). Set failOnDataLoss=false to skip."
                )
            continue
        if e > s:
            ranges.append(KafkaOffsetRange(tp[0], tp[1], s, e))
    if max_records:
        ranges = [piece for r in ranges for piece in _split(r, -(-r.size // max_records))]
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.size for r in ranges)
    return [piece for r in ranges for piece in _split(r, max(1, min(r.size, round(r.size * min_partitions / total))))]


def _split(r: KafkaOffsetRange, pieces: int) -> list[KafkaOffsetRange]:
    """``r`` in ``pieces`` contiguous, near-equal ranges."""
    bounds = [r.start + r.size * i // pieces for i in range(pieces + 1)]
    return [KafkaOffsetRange(r.topic, r.partition, a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


@dataclasses.dataclass(frozen=True)
class KafkaRangeGroup(InputPartition):
    """One Spark partition reading several whole offset ranges, one after the other.

    Built by :func:`group_ranges` when ``maxPartitions`` is below the number of ranges.
    """

    ranges: tuple[KafkaOffsetRange, ...]


def group_ranges(ranges: Sequence[KafkaOffsetRange], max_partitions: int | None) -> list[InputPartition]:
    """Pack ``ranges`` into at most ``max_partitions`` Spark partitions (driver; pure).

    Largest range first into the group with the fewest records so far (ties: the lower
    group), each group then in topic-partition order. A pure function of the ranges and
    the option, so a replayed batch gets the same groups; a range is never split, so a
    topic-partition's records stay in offset order within one task.
    """
    if not max_partitions or len(ranges) <= max_partitions:
        return list(ranges)
    groups: list[list[KafkaOffsetRange]] = [[] for _ in range(max_partitions)]
    loads = [0] * max_partitions
    for r in sorted(ranges, key=lambda r: (-r.size, r.topic, r.partition, r.start)):
        i = min(range(max_partitions), key=lambda j: (loads[j], j))
        groups[i].append(r)
        loads[i] += r.size
    return [KafkaRangeGroup(tuple(sorted(g, key=lambda r: (r.topic, r.partition, r.start)))) for g in groups if g]


def partition_count(ranges: Sequence[KafkaOffsetRange], opts: KafkaOptions) -> int:
    """How many Spark partitions a batch of ``ranges`` gets (driver; pure).

    One per range, at most ``maxPartitions``. Without ``minPartitions``, a batch whose
    ranges average fewer than ``minRecordsPerPartition`` records gets fewer: each
    partition takes the same number of whole ranges, as many as hold about
    ``minRecordsPerPartition`` records on average. A micro-batch of a few records
    runs one task instead of one per topic-partition, and equal ranges pack into
    equal groups (8 ranges into 2 or 4 tasks, never 8 into 6, which would leave two
    tasks with twice the records of the others). Neither with ``maxRecordsPerPartition``,
    whose pieces each stay one partition, as in Spark.
    """
    count = len(ranges)
    if opts.max_partitions:
        count = min(count, opts.max_partitions)
    if not opts.min_partitions and not opts.max_records_per_partition and ranges:
        total = sum(r.size for r in ranges)
        per_group = max(1, -(-opts.min_records_per_partition * len(ranges) // total))
        count = min(count, -(-len(ranges) // per_group))
    return count


def plan_partitions(start: Mapping[TP, int], end: Mapping[TP, int], opts: KafkaOptions) -> list[InputPartition]:
    """The Spark partitions of records ``[start, end)`` (driver; pure, so a replay plans the same).

    A function of the offsets and the options only: the same batch replayed after a
    restart with the same options is cut the same way.
    """
    ranges = plan_ranges(start, end, opts.min_partitions, opts.fail_on_data_loss, opts.max_records_per_partition)
    return group_ranges(ranges, partition_count(ranges, opts))


def resolve_offsets(
    spec: object, tps: Sequence[TP], earliest: Mapping[TP, int], latest: Mapping[TP, int], option: str
) -> dict[TP, int]:
    """Turn ``startingOffsets``/``endingOffsets`` into offsets for ``tps`` (driver).

    Raises
    ------
    ConfigurationError
        When explicit offsets name a topic-partition that is not read (or does not
        exist) or leave out one that is.
    """
    if spec == "earliest":
        return {tp: earliest[tp] for tp in tps}
    if spec == "latest":
        return {tp: latest[tp] for tp in tps}
    given = _covering(spec, tps, option)
    out = {}
    for tp in tps:
        off = given[tp]
        out[tp] = earliest[tp] if off == EARLIEST else latest[tp] if off == LATEST else off
    return out


def _covering(spec: object, tps: Sequence[TP], option: str) -> dict[TP, int]:
    """Explicit per-partition values of ``option``, which must name exactly the partitions read."""
    given = dict(cast("Iterable[tuple[TP, int]]", spec))
    unknown = sorted(tp for tp in given if tp not in set(tps))
    missing = sorted(tp for tp in tps if tp not in given)
    if unknown or missing:
        parts = []
        if unknown:
            parts.append(f"names {_fmt_tps(unknown)} which the source does not read or which do not exist")
        if missing:
            parts.append(f"leaves out {_fmt_tps(missing)}")
        raise ConfigurationError(
            f"kafka_py option {option!r} "
            + " and ".join(parts)
            + "; give a value for every topic-partition read"
            + (" (-2 earliest, -1 latest)" if option.endswith("Offsets") else "")
        )
    return given


def place_timestamps(
    found: Mapping[TP, int | None], latest: Mapping[TP, int], opts: KafkaOptions, starting: bool
) -> dict[TP, int]:
    """Offsets from a lookup by timestamp (driver; pure), with Spark's rules for no match.

    A partition with no record at or after its timestamp starts at its latest offset
    with ``startingOffsetsByTimestampStrategy=latest`` and fails the read with ``error``
    (the default); it ends at its latest offset.

    Raises
    ------
    ConfigurationError
        A starting timestamp matched nothing and the strategy is ``error``.
    """
    missing = sorted(tp for tp, off in found.items() if off is None)
    if missing and starting and opts.timestamp_strategy == "error":
        raise ConfigurationError(
            f"kafka_py option {opts.timestamp_option(True)!r}: no record of {_fmt_tps(missing)} has a timestamp "
            f"at or after the one given; set startingOffsetsByTimestampStrategy=latest to start such "
            f"partitions at their latest offset"
        )
    return {tp: latest[tp] if off is None else off for tp, off in found.items()}


def resolve_bound(
    opts: KafkaOptions,
    meta: _Metadata,
    tps: Sequence[TP],
    earliest: Mapping[TP, int],
    latest: Mapping[TP, int],
    *,
    starting: bool,
) -> dict[TP, int]:
    """Where a read starts (or a batch read ends): by timestamp when one is given, else by offset (driver)."""
    spec = opts.starting_timestamps if starting else opts.ending_timestamps
    if spec is None:
        offsets = opts.starting_offsets if starting else opts.ending_offsets
        return resolve_offsets(offsets, tps, earliest, latest, "startingOffsets" if starting else "endingOffsets")
    option = opts.timestamp_option(starting)
    stamps = {tp: spec for tp in tps} if isinstance(spec, int) else _covering(spec, tps, option)
    return place_timestamps(meta.offsets_for_times(stamps), latest, opts, starting)


def _fmt_tps(tps: Sequence[TP]) -> str:
    return ", ".join(f"{t}[{p}]" for t, p in tps)


# ------------------------------------------------------------------ broker access


def _with_retries(opts: KafkaOptions, what: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` up to ``fetchOffset.numRetries`` times (the project's one retry helper,
    sleeping up to ``fetchOffset.retryIntervalMs`` between tries, each retry logged); then a
    clear error."""
    from kafka.errors import KafkaError

    from clickhouse_tx.retry import RetryPolicy, retry_call

    interval_s = opts.fetch_offset_retry_interval_ms / 1000
    policy = RetryPolicy(
        max_attempts=max(1, opts.fetch_offset_num_retries),
        max_total_s=float("inf"),
        base_delay_s=interval_s,
        max_delay_s=interval_s,
    )
    started = time.monotonic()
    try:
        return retry_call(fn, policy, retry_on=lambda e: isinstance(e, (KafkaError, OSError)), what=f"kafka_py: {what}")
    except (KafkaError, OSError) as last:
        raise KafkaUnavailableError(
            f"kafka_py: {what} failed {policy.max_attempts} times over "
            f"{time.monotonic() - started:.1f}s; is the broker at "
            f"bootstrap.servers={opts.bootstrap_servers} up? last error: {last!r}"
        ) from last


def _new_consumer(opts: KafkaOptions, api_version: tuple[int, ...] | None = None):
    """A connected ``kafka.KafkaConsumer`` for ``opts`` (driver or executor).

    ``api_version``, when known from an earlier consumer of the same settings, skips
    kafka-python's broker-version probe (tens of ms, part of it a sleep).
    """
    from kafka import KafkaConsumer

    cfg = opts.consumer_config()
    if api_version is not None and cfg.get("api_version") is None:
        cfg["api_version"] = api_version
    redact_secrets_in_logs(cfg)
    return _with_retries(opts, "connecting", lambda: KafkaConsumer(**cfg))


def _settings_key(opts: KafkaOptions) -> str:
    """A digest of everything that makes two consumers interchangeable.

    Covers the bootstrap servers and every kafka-python setting, secrets included, so a
    changed password never reuses a consumer; being a digest, the key never carries a
    secret into a log line or an error.
    """
    cfg = opts.consumer_config()
    text = repr(sorted((k, repr(v)) for k, v in cfg.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _connected(consumer: object) -> bool:
    """True while a pooled consumer still holds a live broker connection.

    kafka-python reconnects on its own, but only after a request times out; a consumer
    whose every connection is gone (broker restarted, socket reset while idle) is
    cheaper to replace than to wait for.
    """
    client = getattr(consumer, "_client", None)
    conns = getattr(client, "_conns", None)
    if not conns:
        return False
    return any(conn.connected() for conn in list(conns.values()))


@dataclasses.dataclass
class PoolStats:
    """Counters of one :class:`ConsumerPool` (what the tests and the benchmark read)."""

    created: int = 0
    reused: int = 0
    replaced: int = 0
    closed_idle: int = 0
    discarded: int = 0


class ConsumerPool:
    """Idle kafka-python consumers of one Python worker, reused across tasks and batches.

    Spark reuses Python workers (``spark.python.worker.reuse``, on by default), so a
    consumer left here by one task serves the next range of the same topic-partition in
    a later task or micro-batch of this worker: no new TCP connection, no version probe,
    no metadata round trip, and often records already prefetched at the right position.
    Keyed by (:func:`_settings_key`, topic, partition). A consumer is handed out to one
    reader at a time and positioned by ``seek`` on every checkout, so what it returns
    depends only on the range (replays read the same records). Consumers idle for more
    than ``idle_s`` are closed at the next checkout or give-back; one whose broker
    connections are all gone is replaced at checkout; one that raised is closed, never
    returned. At most ``max_idle`` stay open per worker (the oldest are closed).

    Runs on executors (the module-level :data:`POOL`); tests build their own.
    """

    def __init__(self, idle_s: float = 60.0, max_idle: int = 64) -> None:
        self.idle_s = idle_s
        self.max_idle = max_idle
        self.stats = PoolStats()
        self._idle: dict[tuple[str, str, int], tuple[float, Any]] = {}
        self._versions: dict[str, tuple[int, ...]] = {}
        self._lock = threading.Lock()

    def checkout(self, opts: KafkaOptions, tp: TP) -> tuple[Any, bool]:
        """A consumer assigned to ``tp`` and whether it came from the pool.

        A new one has no position yet; a pooled one is where its last read stopped.
        """
        from kafka import TopicPartition

        settings = _settings_key(opts)
        key = (settings, tp[0], tp[1])
        with self._lock:
            self._close_idle_locked(time.monotonic())
            entry = self._idle.pop(key, None)
        if entry is not None:
            consumer = entry[1]
            if _connected(consumer):
                self.stats.reused += 1
                return consumer, True
            self.stats.replaced += 1
            _close_quietly(consumer)
        consumer = _new_consumer(opts, self._versions.get(settings))
        version = consumer.config.get("api_version")
        if version is not None:
            self._versions[settings] = tuple(version)
        consumer.assign([TopicPartition(*tp)])
        self.stats.created += 1
        return consumer, False

    def give_back(self, opts: KafkaOptions, tp: TP, consumer: Any) -> None:
        """Keep ``consumer`` for the next range of ``tp`` (after a read that did not raise)."""
        key = (_settings_key(opts), tp[0], tp[1])
        now = time.monotonic()
        with self._lock:
            old = self._idle.pop(key, None)
            self._idle[key] = (now, consumer)
            self._close_idle_locked(now)
            while len(self._idle) > self.max_idle:
                oldest = min(self._idle, key=lambda k: self._idle[k][0])
                _close_quietly(self._idle.pop(oldest)[1])
                self.stats.closed_idle += 1
        if old is not None:
            _close_quietly(old[1])

    def discard(self, consumer: Any) -> None:
        """Close a consumer that failed mid-read; it is never reused."""
        self.stats.discarded += 1
        _close_quietly(consumer)

    def idle_count(self) -> int:
        with self._lock:
            return len(self._idle)

    def close_idle(self) -> None:
        """Close every consumer idle for more than ``idle_s`` (also run on each checkout)."""
        with self._lock:
            self._close_idle_locked(time.monotonic())

    def close_all(self) -> None:
        """Close every pooled consumer (at worker exit, and in tests)."""
        with self._lock:
            entries = list(self._idle.values())
            self._idle.clear()
        for _, consumer in entries:
            _close_quietly(consumer)

    def _close_idle_locked(self, now: float) -> None:
        for key in [k for k, (t, _) in self._idle.items() if now - t > self.idle_s]:
            _close_quietly(self._idle.pop(key)[1])
            self.stats.closed_idle += 1


def _close_quietly(consumer: Any) -> None:
    try:
        consumer.close(autocommit=False)
    except Exception as e:  # closing a broken consumer must not fail a read
        log.debug("kafka_py: closing a pooled consumer failed: %r", e)


#: This Python worker's consumers (executors); closed when the worker exits.
POOL = ConsumerPool()
atexit.register(POOL.close_all)


class _Metadata:
    """Driver-side view of the cluster: topic-partitions and their offsets.

    Lives in the driver's stream-reader worker for the whole query (one TCP
    connection reused across triggers); recreated if the broker drops it.
    """

    def __init__(self, opts: KafkaOptions) -> None:
        self.opts = opts
        self._consumer = None

    def _c(self):
        if self._consumer is None:
            # Before kafka-python, which retries a refused password forever and an
            # untrusted certificate like a dead broker: fail at once, naming the option.
            cfg = self.opts.consumer_config()
            redact_secrets_in_logs(cfg)
            check_access(cfg, self.opts.bootstrap_servers)
            self._consumer = _new_consumer(self.opts)
        return self._consumer

    def topic_partitions(self) -> list[TP]:
        """The topic-partitions this read covers, sorted (fresh metadata every call)."""
        if self.opts.assign is not None:
            return sorted((t, p) for t, parts in self.opts.assign for p in parts)

        def fetch() -> list[TP]:
            c = self._c()
            names = c.topics()  # always a fresh metadata request: sees new partitions
            if self.opts.subscribe is not None:
                wanted = [t for t in self.opts.subscribe if t in names]
            else:
                rx = re.compile(self.opts.subscribe_pattern or "")
                wanted = sorted(t for t in names if rx.fullmatch(t))
            return sorted((t, p) for t in wanted for p in (c.partitions_for_topic(t) or ()))

        return _with_retries(self.opts, "listing topic partitions", fetch)

    def earliest(self, tps: Sequence[TP]) -> dict[TP, int]:
        return self._offsets(tps, "beginning_offsets")

    def offsets_for_times(self, stamps: Mapping[TP, int]) -> dict[TP, int | None]:
        """The first offset at or after each timestamp (ms), None where no record is that recent."""
        if not stamps:
            return {}
        from kafka import TopicPartition

        def fetch() -> dict[TP, int | None]:
            got = self._c().offsets_for_times({TopicPartition(t, p): ts for (t, p), ts in stamps.items()})
            return {(tp.topic, tp.partition): None if found is None else int(found.offset) for tp, found in got.items()}

        return _with_retries(self.opts, "looking offsets up by timestamp", fetch)

    def latest(self, tps: Sequence[TP]) -> dict[TP, int]:
        return self._offsets(tps, "end_offsets")

    def _offsets(self, tps: Sequence[TP], method: str) -> dict[TP, int]:
        if not tps:
            return {}
        from kafka import TopicPartition

        def fetch() -> dict[TP, int]:
            got = getattr(self._c(), method)([TopicPartition(t, p) for t, p in tps])
            return {(tp.topic, tp.partition): int(o) for tp, o in got.items()}

        return _with_retries(self.opts, f"fetching {method.replace('_', ' ')}", fetch)

    def close(self) -> None:
        if self._consumer is not None:
            try:
                self._consumer.close()
            finally:
                self._consumer = None


# ------------------------------------------------------------------ executor read


def read_range(opts: KafkaOptions, rng: KafkaOffsetRange, pool: ConsumerPool | None = None) -> Iterator[pa.RecordBatch]:
    """Read records ``[rng.start, rng.end)`` as Arrow record batches (executor).

    Called once per range per (re)try of a task. Stops at ``rng.end`` even if the
    partition has grown since, so every attempt returns the same records. The consumer
    comes from ``pool`` (default: this worker's :data:`POOL`) and goes back to it after
    a read that did not raise; one that raised is closed. Logs, at DEBUG on this
    module's logger, where the read's time went (checkout, first records, Arrow, total).

    Raises
    ------
    KafkaDataLossError
        Records in the range are gone and ``failOnDataLoss`` is true.
    KafkaUnavailableError
        No broker answered, or the records did not arrive within
        ``kafkaConsumer.pollTimeoutMs``.
    """
    if rng.size <= 0:
        return
    pool = POOL if pool is None else pool
    tp = (rng.topic, rng.partition)
    clock = _ReadClock(time.monotonic())
    consumer, reused = pool.checkout(opts, tp)
    clock.checked_out = time.monotonic()
    try:
        yield from _read_records(opts, consumer, rng, clock, reused)
    except GeneratorExit:
        pool.give_back(opts, tp, consumer)  # the caller stopped early: the consumer is fine
        raise
    except BaseException:
        pool.discard(consumer)
        raise
    pool.give_back(opts, tp, consumer)
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "kafka_py: read %s[%d] [%d, %d): %d rows, consumer %s, checkout %.1f ms, "
            "first records %.1f ms, arrow %.1f ms, total %.1f ms",
            rng.topic,
            rng.partition,
            rng.start,
            rng.end,
            clock.rows,
            "reused" if reused else "new",
            clock.ms(clock.checked_out),
            clock.ms(clock.first_records),
            clock.arrow_s * 1000,
            clock.ms(time.monotonic()),
        )


def read_partition(opts: KafkaOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """Read one Spark partition: an offset range, or a group of them in order (executor)."""
    if isinstance(partition, KafkaRangeGroup):
        for rng in partition.ranges:
            yield from read_range(opts, rng)
        return
    assert isinstance(partition, KafkaOffsetRange)
    yield from read_range(opts, partition)


@dataclasses.dataclass
class _ReadClock:
    """Where one range's read spent its time (for the DEBUG line of :func:`read_range`)."""

    started: float
    checked_out: float = 0.0
    first_records: float = 0.0
    arrow_s: float = 0.0
    rows: int = 0

    def ms(self, t: float) -> float:
        return (t - self.started) * 1000 if t else 0.0


def _read_records(
    opts: KafkaOptions, consumer: Any, rng: KafkaOffsetRange, clock: _ReadClock, pooled: bool
) -> Iterator[pa.RecordBatch]:
    """The fetch loop of :func:`read_range` on an assigned consumer (executor)."""
    from kafka import TopicPartition
    from kafka.errors import OffsetOutOfRangeError

    schema = arrow_schema(opts.value_fields, opts.include_headers)
    tp = TopicPartition(rng.topic, rng.partition)
    pos = rng.start
    # A pooled consumer that stopped exactly where this range starts (the next
    # micro-batch of its partition) may hold prefetched records for it: a seek would
    # drop them, so it seeks only when it is elsewhere.
    if not pooled or consumer.position(tp, timeout_ms=opts.poll_timeout_ms) != pos:
        consumer.seek(tp, pos)
    deadline = time.monotonic() + opts.poll_timeout_ms / 1000
    while pos < rng.end:
        try:
            # Never more than the range holds: records past its end stay buffered in
            # the consumer, at its position, for the next range (next micro-batch).
            got = consumer.poll(
                timeout_ms=min(1000, opts.poll_timeout_ms), max_records=min(opts.max_records_per_batch, rng.end - pos)
            )
        except OffsetOutOfRangeError:
            pos = _after_out_of_range(opts, consumer, tp, rng, pos)
            if pos >= rng.end:
                return
            consumer.seek(tp, pos)
            continue
        records = got.get(tp, [])
        if records:
            if not clock.first_records:
                clock.first_records = time.monotonic()
            deadline = time.monotonic() + opts.poll_timeout_ms / 1000
            if records[-1].offset >= rng.end:
                records = [r for r in records if r.offset < rng.end]
            if records:
                t = time.monotonic()
                batch = _to_batch(records, rng.topic, rng.partition, schema)
                clock.arrow_s += time.monotonic() - t
                clock.rows += batch.num_rows
                yield batch
                pos = records[-1].offset + 1
            else:
                pos = rng.end
        # Transaction markers and compacted-away offsets advance the position
        # without records; the position, not the last record, says where we are.
        if pos < rng.end:
            position = consumer.position(tp, timeout_ms=opts.poll_timeout_ms)
            if position is not None and position > pos:
                pos = position
        if pos < rng.end and not records and time.monotonic() > deadline:
            raise KafkaUnavailableError(
                f"kafka_py: no records from {rng.topic}[{rng.partition}] at offset {pos} "
                f"(range ends at {rng.end}) within kafkaConsumer.pollTimeoutMs="
                f"{opts.poll_timeout_ms}; bootstrap.servers={opts.bootstrap_servers}"
            )


def _after_out_of_range(opts: KafkaOptions, consumer, tp, rng: KafkaOffsetRange, pos: int) -> int:
    """Where to continue after the broker said ``pos`` is out of range (executor)."""
    begin = int(consumer.beginning_offsets([tp])[tp])
    end = int(consumer.end_offsets([tp])[tp])
    if begin > pos:
        lost = f"offsets [{pos}, {min(begin, rng.end)}) of {rng.topic}[{rng.partition}]"
        if opts.fail_on_data_loss:
            raise KafkaDataLossError(
                f"kafka_py: {lost} were deleted (retention?) before they were read. "
                f"Set failOnDataLoss=false to skip them."
            )
        log.warning("kafka_py: skipping %s: deleted before they were read", lost)
        return begin
    # pos beyond the log end: the partition was truncated or re-created.
    if opts.fail_on_data_loss:
        raise KafkaDataLossError(
            f"kafka_py: {rng.topic}[{rng.partition}] ends at {end}, below the planned range "
            f"[{pos}, {rng.end}) (topic re-created?). Set failOnDataLoss=false to skip."
        )
    log.warning(
        "kafka_py: skipping [%d, %d) of %s[%d]: beyond the log end %d", pos, rng.end, rng.topic, rng.partition, end
    )
    return rng.end


def _to_batch(records: list[Any], topic: str, partition: int, schema: pa.Schema) -> pa.RecordBatch:
    """One Arrow record batch from one fetch of one partition (columns built from lists;
    ``value`` decoded from JSON when ``schema`` says it is a struct)."""
    n = len(records)
    keys = [r.key for r in records]
    values = [r.value for r in records]
    offsets = [r.offset for r in records]
    stamps = [r.timestamp for r in records]
    stamp_types = [r.timestamp_type for r in records]

    # Microseconds built in Python: the first pyarrow.compute call of a fresh worker
    # costs about two seconds, the list comprehension microseconds.
    ts = pa.array([s * 1000 for s in stamps], schema.field("timestamp").type)
    value_type = schema.field("value").type
    if pa.types.is_struct(value_type):
        value_column = decode_values(values, value_type, topic, partition, offsets)
    else:
        value_column = pa.array(values, pa.binary())
    columns = [
        pa.array(keys, pa.binary()),
        value_column,
        pa.array([topic] * n, pa.string()),
        pa.array([partition] * n, pa.int32()),
        pa.array(offsets, pa.int64()),
        ts,
        pa.array(stamp_types, pa.int32()),
    ]
    if "headers" in schema.names:
        columns.append(_headers_column([r.headers for r in records], schema.field("headers").type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _headers_column(header_lists: list[Any], headers_type: pa.DataType) -> pa.Array:
    """The ``headers`` column (``includeHeaders=true``): a list of (key, value) structs per record."""
    n = len(header_lists)
    lengths = [len(h) if h else 0 for h in header_lists]
    if any(lengths):
        flat = [kv for h in header_lists if h for kv in h]
        hkeys = pa.array([k for k, _ in flat], pa.string())
        hvalues = pa.array([v for _, v in flat], pa.binary())
        struct = pa.StructArray.from_arrays([hkeys, hvalues], fields=list(headers_type.value_type))
        bounds = [0] * (n + 1)
        acc = 0
        for i, ln in enumerate(lengths):
            acc += ln
            bounds[i + 1] = acc
        return pa.ListArray.from_arrays(pa.array(bounds, pa.int32()), struct, type=headers_type)
    return pa.array([[]] * n, headers_type)


# ------------------------------------------------------------------ Spark classes


class KafkaBatchReader(DataSourceReader):
    """``spark.read.format("kafka_py")``: records from startingOffsets to endingOffsets.

    ``partitions()`` runs on the driver; the reader is pickled to executors for
    ``read()``.
    """

    def __init__(self, opts: KafkaOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        meta = _Metadata(self.opts)
        try:
            tps = meta.topic_partitions()
            earliest, latest = meta.earliest(tps), meta.latest(tps)
            start = resolve_bound(self.opts, meta, tps, earliest, latest, starting=True)
            end = resolve_bound(self.opts, meta, tps, earliest, latest, starting=False)
        finally:
            meta.close()
        return plan_partitions(start, end, self.opts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Executor, once per Spark partition and task attempt, in a reused Python worker."""
        worker_gc.before_task()
        return read_partition(self.opts, partition)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("kafka_py")``.

    Driver methods run in one Python worker that lives as long as the query;
    ``read`` runs on executors with a pickled copy (it uses only ``opts``).
    """

    def __init__(self, opts: KafkaOptions) -> None:
        self.opts = opts
        self._meta: _Metadata | None = None
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

    def _m(self) -> _Metadata:
        if self._meta is None:
            self._meta = _Metadata(self.opts)
        return self._meta

    def initialOffset(self) -> dict[str, Any]:
        """Offsets a new query starts from (driver, once per new checkpoint)."""
        m = self._m()
        tps = m.topic_partitions()
        start = resolve_bound(self.opts, m, tps, m.earliest(tps), m.latest(tps), starting=True)
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

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """Offset ranges of one micro-batch (driver; pure, so a replay plans the same).

        The first batch's start is the one logged in its end (:data:`START_KEY`), not
        the ``start`` Spark passes: on a replay that is a fresh ``initialOffset()``.
        """
        begin = from_json_offsets(end[START_KEY]) if START_KEY in end else from_json_offsets(start)
        return plan_partitions(begin, from_json_offsets(end), self.opts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Executor, once per Spark partition and task attempt, in a reused Python worker."""
        worker_gc.before_task()
        return read_partition(self.opts, partition)

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
