"""Options of the ``kafka_py`` source, parsed once into a frozen, validated object.

Spark hands a Python data source its options as a case-insensitive mapping of
strings. :func:`parse_kafka_options` turns that into :class:`KafkaOptions`: typed,
checked, picklable (it travels from the driver to every executor inside the reader)
and safe to print (secrets passed through ``kafka.*`` never reach ``repr`` or errors).
Each option is declared once, in :mod:`spark_datasource.kafka.option_specs`; the
rules here check the options read together (exactly one subscription, offsets by
kind of read, bounds against each other).

Option names follow Spark's built-in Kafka source where one exists
(``subscribe``, ``assign``, ``startingOffsets``, ``maxOffsetsPerTrigger``, ...), so a
job can switch between ``kafka`` and ``kafka_py`` by changing the format name.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from spark_datasource.kafka.client_settings import KafkaParams, kafka_params
from spark_datasource.kafka.json_values import ValueFields, parse_value_schema
from spark_datasource.kafka.librdkafka_settings import choose_client
from spark_datasource.kafka.offset_parsers import EARLIEST, LATEST, OffsetSpec, TimestampSpec
from spark_datasource.kafka.option_specs import KAFKA_OPTIONS, kafka_option_error
from spark_datasource.kafka.security import check_security
from spark_datasource.options.spec import lower_keys

__all__ = ["KafkaOptions", "parse_kafka_options"]

_fail = kafka_option_error


@dataclasses.dataclass(frozen=True, kw_only=True)
class KafkaOptions:
    """Validated options of one ``kafka_py`` read (driver-built, shipped to executors).

    Attributes
    ----------
    bootstrap_servers
        ``host:port[,host:port...]`` as given.
    subscribe, subscribe_pattern, assign
        Exactly one is set: a tuple of topics, a regex source, or explicit
        ``(topic, (partitions...))`` pairs.
    starting_offsets, ending_offsets
        ``"earliest"``, ``"latest"`` or ``((topic, partition), offset)`` pairs
        (offset -2 = earliest, -1 = latest).
    max_offsets_per_trigger
        Upper bound of records per micro-batch across all partitions, or None.
    min_partitions
        Split offset ranges so a batch has at least this many Spark partitions.
    max_partitions
        Pack whole offset ranges into at most this many Spark partitions per batch
        (fewer tasks: each task has a fixed cost), or None for one per range.
    min_records_per_partition
        Pack whole offset ranges of a small batch, the same number into each Spark
        partition, so each holds about this many records on average (1: one
        partition per range); not applied when ``min_partitions`` is given.
    fail_on_data_loss
        Raise when records in a planned range are gone (retention, deleted topic);
        when False, skip what is gone and read what is left.
    poll_timeout_ms
        How long an executor waits for records it knows exist before failing.
    fetch_offset_num_retries, fetch_offset_retry_interval_ms
        Attempts and pause for driver-side metadata/offset requests.
    max_records_per_batch
        Largest Arrow record batch an executor yields.
    starting_timestamps, ending_timestamps
        ``startingTimestamp``/``startingOffsetsByTimestamp`` (and the ending pair, batch
        reads): they win over ``startingOffsets``/``endingOffsets``; None when not given.
    timestamp_strategy
        ``startingOffsetsByTimestampStrategy``: ``error`` or ``latest``, for a partition
        with no record at or after its starting timestamp.
    min_offsets_per_trigger, max_trigger_delay_ms
        A micro-batch waits for this many new records in total, at most this long.
    include_headers
        Whether rows have the ``headers`` column (Spark's default: no).
    max_records_per_partition
        Split offset ranges so no Spark partition reads more records than this.
    kafka_params
        Extra kafka-python settings from ``kafka.*`` options (secrets masked in repr).
    client
        ``kafka.client`` resolved on the driver: ``kafka-python`` or ``librdkafka``
        (:func:`~spark_datasource.kafka.librdkafka_settings.choose_client`).
    client_auto
        ``client`` was chosen by ``auto``: an executor without ``confluent_kafka``
        reads with kafka-python instead of failing.
    value_fields
        With ``value.format=json``: the ``(name, type)`` fields of ``value.schema``, and
        the ``value`` column is their struct, decoded in the source; None: raw bytes.
    """

    bootstrap_servers: str
    subscribe: tuple[str, ...] | None = None
    subscribe_pattern: str | None = None
    assign: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    starting_offsets: OffsetSpec = "latest"
    ending_offsets: OffsetSpec
    max_offsets_per_trigger: int | None
    min_partitions: int | None = None
    max_partitions: int | None = None
    min_records_per_partition: int
    fail_on_data_loss: bool
    poll_timeout_ms: int
    fetch_offset_num_retries: int
    fetch_offset_retry_interval_ms: int
    max_records_per_batch: int
    kafka_params: tuple[tuple[str, object], ...] = dataclasses.field(default_factory=KafkaParams)
    value_fields: ValueFields | None = None
    starting_timestamps: TimestampSpec | None = None
    ending_timestamps: TimestampSpec | None = None
    timestamp_strategy: str
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int
    include_headers: bool
    max_records_per_partition: int | None = None
    client: str = "kafka-python"
    client_auto: bool = False

    def timestamp_option(self, starting: bool) -> str:
        """The option the starting (or ending) timestamps came from, for error messages."""
        spec = self.starting_timestamps if starting else self.ending_timestamps
        word = "starting" if starting else "ending"
        return f"{word}Timestamp" if isinstance(spec, int) else f"{word}OffsetsByTimestamp"

    def consumer_config(self) -> dict[str, object]:
        """Keyword arguments for ``kafka.KafkaConsumer`` (driver and executors)."""
        cfg: dict[str, object] = {
            "bootstrap_servers": self.bootstrap_servers.split(","),
            "enable_auto_commit": False,
            "group_id": None,
            "auto_offset_reset": "none",  # out-of-range raises: we decide about data loss
            "allow_auto_create_topics": False,
            "request_timeout_ms": 30_000,
            "max_poll_records": self.max_records_per_batch,
            "client_id": "kafka_py",
            # Records of aborted (or still open) producer transactions are never
            # delivered, and end offsets stop at the last stable offset (Spark's source
            # leaves the Java client's read_uncommitted). ``kafka.isolation.level`` opts out.
            "isolation_level": "read_committed",
            # An executor asks only for records its range says exist, so a broker
            # that has none at the fetch position should answer at once. With
            # kafka-python's 500 ms, the prefetch a consumer sends at a range's end
            # (the log end) parks at the broker, and the next micro-batch's read on
            # that pooled consumer waits for it before it can fetch.
            "fetch_max_wait_ms": 10,
        }
        cfg.update(dict(self.kafka_params))
        return cfg


def parse_kafka_options(options: Mapping[str, str], *, streaming: bool | None = None) -> KafkaOptions:
    """Validate ``options`` (names case-insensitive) and build :class:`KafkaOptions`.

    Runs on the driver, when the DataFrame is defined (``load()``), so mistakes fail
    before any job starts. ``streaming`` None checks what batch and streaming reads
    share; True/False adds the checks of that kind of read.

    Raises
    ------
    ConfigurationError
        Naming the offending option.
    """
    opts = lower_keys(options)
    KAFKA_OPTIONS.refuse_unknown(opts)
    params = sorted(check_security(dict(kafka_params(opts))).items())
    v = KAFKA_OPTIONS.read_all(opts)
    fields = {s.field: v[s.name] for s in KAFKA_OPTIONS.specs if s.field}
    return KafkaOptions(
        client=choose_client(v["kafka.client"], dict(params)),
        client_auto=v["kafka.client"] == "auto",
        bootstrap_servers=_bootstrap(opts),
        **_subscription(v),
        **_offset_bounds(v, opts, streaming),
        **_partition_bounds(v),
        kafka_params=KafkaParams(params),
        value_fields=_value_fields(v),
        **_timestamps(v, streaming),
        **_trigger_bounds(v, opts, streaming),
        **fields,
    )


def _bootstrap(opts: Mapping[str, str]) -> str:
    """``bootstrap.servers`` (or ``kafka.bootstrap.servers``, not both differently), checked."""
    servers = [opts.get(k, "").strip() for k in ("bootstrap.servers", "kafka.bootstrap.servers")]
    if servers[0] and servers[1] and servers[0] != servers[1]:
        raise _fail("bootstrap.servers", "differs from kafka.bootstrap.servers; give one")
    if not servers[0] and not servers[1]:
        raise _fail("bootstrap.servers", "is required (host:port[,host:port...])")
    return str(KAFKA_OPTIONS["bootstrap.servers"].parse(servers[0] or servers[1]))


def _subscription(v: Mapping[str, Any]) -> dict[str, Any]:
    """Exactly one of subscribe, subscribePattern, assign (the others None)."""
    chosen = [name for name in ("subscribe", "subscribePattern", "assign") if v[name] is not None]
    if len(chosen) != 1:
        raise _fail(
            "subscribe",
            "give exactly one of subscribe, subscribePattern, assign"
            + (f" (got {', '.join(chosen)})" if chosen else ""),
        )
    return {"subscribe": v["subscribe"], "subscribe_pattern": v["subscribePattern"], "assign": v["assign"]}


def _offset_bounds(v: Mapping[str, Any], opts: Mapping[str, str], streaming: bool | None) -> dict[str, Any]:
    """``startingOffsets`` and ``endingOffsets``, with the checks of a batch or a streaming read
    (``opts``: the options as given, for those refused when given at all)."""
    starting = v["startingOffsets"] or ("earliest" if streaming is False else "latest")
    ending = v["endingOffsets"]
    if streaming is True and opts.get("endingoffsets"):
        raise _fail("endingOffsets", "applies to batch reads only (spark.read); a stream reads until stopped")
    if streaming is False:
        if starting == "latest" or (isinstance(starting, tuple) and any(o == LATEST for _, o in starting)):
            raise _fail("startingOffsets", "latest (-1) is not allowed in a batch read")
        if ending == "earliest" or (isinstance(ending, tuple) and any(o == EARLIEST for _, o in ending)):
            raise _fail("endingOffsets", "earliest (-2) is not allowed in a batch read")
        if opts.get("maxoffsetspertrigger"):
            raise _fail("maxOffsetsPerTrigger", "applies to streaming reads only")
    return {"starting_offsets": starting, "ending_offsets": ending}


def _partition_bounds(v: Mapping[str, Any]) -> dict[str, Any]:
    """``minPartitions`` and ``maxPartitions`` (min above max refused), and ``maxRecordsPerPartition``
    (refused with ``maxPartitions``: one caps a task's records, the other the number of tasks)."""
    low, high, most = v["minPartitions"], v["maxPartitions"], v["maxRecordsPerPartition"]
    if low and high and low > high:
        raise _fail(
            "maxPartitions",
            f"is {high}, below minPartitions={low}; give one of them, or a maxPartitions at least minPartitions",
        )
    if most and high:
        raise _fail(
            "maxRecordsPerPartition",
            "cannot be combined with maxPartitions: one splits ranges, the other packs them; give one",
        )
    return {"min_partitions": low, "max_partitions": high, "max_records_per_partition": most}


def _timestamps(v: Mapping[str, Any], streaming: bool | None) -> dict[str, Any]:
    """``starting_timestamps`` and ``ending_timestamps``: ``<word>Timestamp`` wins (as in Spark)
    over ``<word>OffsetsByTimestamp``; None when neither is given."""
    spec = {
        word: v[f"{word}Timestamp"] if v[f"{word}Timestamp"] is not None else v[f"{word}OffsetsByTimestamp"]
        for word in ("starting", "ending")
    }
    if streaming is True and spec["ending"] is not None:
        option = "endingTimestamp" if isinstance(spec["ending"], int) else "endingOffsetsByTimestamp"
        raise _fail(option, "applies to batch reads only (spark.read); a stream reads until stopped")
    return {"starting_timestamps": spec["starting"], "ending_timestamps": spec["ending"]}


def _trigger_bounds(v: Mapping[str, Any], opts: Mapping[str, str], streaming: bool | None) -> dict[str, Any]:
    """``minOffsetsPerTrigger`` (streaming only, with ``maxTriggerDelay``), at most ``maxOffsetsPerTrigger``."""
    if streaming is False:
        for name in ("minOffsetsPerTrigger", "maxTriggerDelay"):
            if opts.get(name.lower()):
                raise _fail(name, "applies to streaming reads only")
    low, high = v["minOffsetsPerTrigger"], v["maxOffsetsPerTrigger"]
    if low and high and low > high:
        raise _fail("minOffsetsPerTrigger", f"is {low}, above maxOffsetsPerTrigger={high}")
    return {"min_offsets_per_trigger": low}


def _value_fields(v: Mapping[str, Any]) -> ValueFields | None:
    """``value.format`` and ``value.schema``: the fields of decoded JSON values, or None."""
    schema = v["value.schema"]
    if v["value.format"] == "binary":
        if schema is not None:
            raise _fail("value.schema", "is only read with value.format=json")
        return None
    if schema is None:
        raise _fail("value.schema", "is required with value.format=json: the fields to decode, as `name TYPE, ...`")
    return parse_value_schema(schema)
