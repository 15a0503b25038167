"""Options of the ``kafka_py`` source, parsed once into a frozen, validated object.

Spark hands a Python data source its options as a case-insensitive mapping of
strings. :func:`parse_kafka_options` turns that into :class:`KafkaOptions`: typed,
checked, picklable (it travels from the driver to every executor inside the reader)
and safe to print (secrets passed through ``kafka.*`` never reach ``repr`` or errors).

Option names follow Spark's built-in Kafka source where one exists
(``subscribe``, ``assign``, ``startingOffsets``, ``maxOffsetsPerTrigger``, ...), so a
job can switch between ``kafka`` and ``kafka_py`` by changing the format name.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Mapping, overload

from clickhouse_tx.errors import ConfigurationError
from spark_datasource.kafka_json import ValueFields, parse_value_schema
from spark_datasource.kafka_security import check_security

#: Offsets keyed by (topic, partition). -2 means earliest, -1 latest (Spark's JSON).
TopicPartitionOffsets = Mapping[tuple[str, int], int]
#: ``"earliest"``, ``"latest"`` or explicit offsets per topic-partition.
OffsetSpec = str | tuple[tuple[tuple[str, int], int], ...]
#: A timestamp (ms since the epoch) for every partition read (``startingTimestamp``), or
#: one per topic-partition (``startingOffsetsByTimestamp``).
TimestampSpec = int | tuple[tuple[tuple[str, int], int], ...]

EARLIEST = -2
LATEST = -1

_SECRET = re.compile(r"password|secret|token|oauth|jaas|key_?file|keystore", re.I)

# Options Spark itself may put in the map of a streaming/batch source.
_SPARK_INJECTED = {"path", "paths"}

# kafka-python settings the source must own: changing them would break the offsets
# bookkeeping that makes a replay read exactly the same records.
_FORBIDDEN_KAFKA = {
    "auto_offset_reset": "use startingOffsets / failOnDataLoss",
    "enable_auto_commit": "offsets live in the Spark checkpoint, never in Kafka",
    "key_deserializer": "key and value are returned as binary; cast them in Spark",
    "value_deserializer": "the value is returned as binary, or decoded by value.format=json",
    "consumer_timeout_ms": "use kafkaConsumer.pollTimeoutMs",
}

_ISOLATION_LEVELS = ("read_committed", "read_uncommitted")

#: ``minRecordsPerPartition``: a batch smaller than this many records per offset range
#: is packed into fewer Spark partitions. pyspark's path for one Python data-source
#: task costs about 90-100 ms whatever it reads (docs/performance.md); a task of 20,000
#: records reads for about 150-200 ms, so the fixed part stays under a third of it.
DEFAULT_MIN_RECORDS_PER_PARTITION = 20_000

_KNOWN = {
    "bootstrap.servers",
    "kafka.bootstrap.servers",
    "subscribe",
    "subscribepattern",
    "assign",
    "startingoffsets",
    "endingoffsets",
    "maxoffsetspertrigger",
    "minpartitions",
    "maxpartitions",
    "minrecordsperpartition",
    "failondataloss",
    "kafkaconsumer.polltimeoutms",
    "fetchoffset.numretries",
    "fetchoffset.retryintervalms",
    "maxrecordsperbatch",
    "value.format",
    "value.schema",
    "startingtimestamp",
    "startingoffsetsbytimestamp",
    "endingtimestamp",
    "endingoffsetsbytimestamp",
    "startingoffsetsbytimestampstrategy",
    "minoffsetspertrigger",
    "maxtriggerdelay",
    "includeheaders",
    "maxrecordsperpartition",
    "groupidprefix",
    "kafka.group.id",
}

#: Spark's default ``maxTriggerDelay``.
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000
_TIME_UNITS_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _kafka_python_defaults() -> Mapping[str, object]:
    # The driver parses the options before any task runs: a missing extra fails here, with the fix.
    try:
        from kafka import KafkaConsumer  # kafka-python 2.3.x
    except ImportError as e:
        raise ConfigurationError(
            "kafka_py needs kafka-python, which the base install leaves out: pip install 'clickhouse-tx[kafka]'"
        ) from e
    return KafkaConsumer.DEFAULT_CONFIG


class _KafkaParams(tuple[Any, ...]):
    """``(name, value)`` pairs for kafka-python; secrets are masked in ``repr``."""

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={'***' if _SECRET.search(k) else repr(v)}" for k, v in self)
        return f"KafkaParams({shown})"


@dataclasses.dataclass(frozen=True)
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
    value_fields
        With ``value.format=json``: the ``(name, type)`` fields of ``value.schema``, and
        the ``value`` column is their struct, decoded in the source; None: raw bytes.
    """

    bootstrap_servers: str
    subscribe: tuple[str, ...] | None = None
    subscribe_pattern: str | None = None
    assign: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    starting_offsets: OffsetSpec = "latest"
    ending_offsets: OffsetSpec = "latest"
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    max_partitions: int | None = None
    min_records_per_partition: int = DEFAULT_MIN_RECORDS_PER_PARTITION
    fail_on_data_loss: bool = True
    poll_timeout_ms: int = 120_000
    fetch_offset_num_retries: int = 3
    fetch_offset_retry_interval_ms: int = 1000
    max_records_per_batch: int = 10_000
    kafka_params: tuple[tuple[str, object], ...] = dataclasses.field(default_factory=_KafkaParams)
    value_fields: ValueFields | None = None
    starting_timestamps: TimestampSpec | None = None
    ending_timestamps: TimestampSpec | None = None
    timestamp_strategy: str = "error"
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    include_headers: bool = False
    max_records_per_partition: int | None = None

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


def _fail(option: str, problem: str) -> ConfigurationError:
    return ConfigurationError(f"kafka_py option {option!r}: {problem}")


@overload
def _int_option(opts: Mapping[str, str], key: str, name: str, *, minimum: int, default: int) -> int: ...


@overload
def _int_option(opts: Mapping[str, str], key: str, name: str, *, minimum: int, default: None) -> int | None: ...


def _int_option(opts: Mapping[str, str], key: str, name: str, *, minimum: int, default: int | None) -> int | None:
    raw = opts.get(key)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise _fail(name, f"expected an integer, got {raw!r}") from None
    if value < minimum:
        raise _fail(name, f"must be >= {minimum}, got {value}")
    return value


def _bool_option(opts: Mapping[str, str], key: str, name: str, default: bool) -> bool:
    raw = opts.get(key)
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise _fail(name, f"expected true or false, got {raw!r}")


def _parse_offsets_json(name: str, raw: str) -> OffsetSpec:
    text = raw.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        doc = json.loads(text)
    except ValueError:
        raise _fail(
            name, f'expected "earliest", "latest" or JSON like {{"topic": {{"0": 23, "1": -2}}}}, got {raw!r}'
        ) from None
    if not isinstance(doc, dict) or not doc:
        raise _fail(name, 'expected a non-empty JSON object {"topic": {"partition": offset}}')
    pairs: list[tuple[tuple[str, int], int]] = []
    for topic, parts in doc.items():
        if not isinstance(parts, dict):
            raise _fail(name, f"topic {topic!r} must map to an object of partition -> offset")
        for p, off in parts.items():
            try:
                pid = int(p)
            except (TypeError, ValueError):
                raise _fail(name, f"partition {p!r} of topic {topic!r} is not an integer") from None
            if isinstance(off, bool) or not isinstance(off, int) or off < -2 or pid < 0:
                raise _fail(
                    name, f"offset of {topic}[{p}] must be an integer >= -2 (-2 earliest, -1 latest), got {off!r}"
                )
            pairs.append(((topic, pid), off))
    return tuple(sorted(pairs))


def _parse_assign(raw: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    try:
        doc = json.loads(raw)
    except ValueError:
        raise _fail("assign", f'expected JSON like {{"topic": [0, 1]}}, got {raw!r}') from None
    if not isinstance(doc, dict) or not doc:
        raise _fail("assign", 'expected a non-empty JSON object like {"topic": [0, 1]}')
    out = []
    for topic, parts in doc.items():
        if (
            not isinstance(parts, list)
            or not parts
            or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in parts)
        ):
            raise _fail("assign", f"topic {topic!r} must map to a non-empty list of partition numbers, got {parts!r}")
        out.append((topic, tuple(sorted(set(parts)))))
    return tuple(sorted(out))


def _coerce_kafka_value(option: str, key: str, raw: str, default: object) -> object:
    text = str(raw).strip()
    if key == "api_version":
        try:
            return tuple(int(x) for x in text.split("."))
        except ValueError:
            raise _fail(option, f"expected a version like 2.5.0, got {raw!r}") from None
    if isinstance(default, bool):
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        raise _fail(option, f"expected true or false, got {raw!r}")
    if isinstance(default, int):
        try:
            return int(text)
        except ValueError:
            raise _fail(option, f"expected an integer, got {'***' if _SECRET.search(key) else repr(raw)}") from None
    if isinstance(default, float):
        try:
            return float(text)
        except ValueError:
            raise _fail(option, f"expected a number, got {raw!r}") from None
    if key == "isolation_level" and text not in _ISOLATION_LEVELS:
        raise _fail(option, f"expected one of {', '.join(_ISOLATION_LEVELS)}, got {raw!r}")
    if default is None or isinstance(default, str):
        return text
    raise _fail(
        option, f"kafka-python setting {key!r} takes a {type(default).__name__}, which cannot be given as an option"
    )


def _kafka_params(opts: Mapping[str, str]) -> list[tuple[str, object]]:
    """The ``kafka.*`` settings as kafka-python keywords; any other unknown option refused."""
    kafka_defaults = _kafka_python_defaults()
    kafka_params: list[tuple[str, object]] = []
    for key, raw in sorted(opts.items()):
        if key.startswith("kafka.") and key not in ("kafka.bootstrap.servers", "kafka.group.id"):
            setting = key[len("kafka.") :].replace(".", "_")
            if setting in _FORBIDDEN_KAFKA:
                raise _fail(key, f"cannot be set: {_FORBIDDEN_KAFKA[setting]}")
            if setting not in kafka_defaults:
                raise _fail(key, f"kafka-python has no setting {setting!r}")
            kafka_params.append((setting, _coerce_kafka_value(key, setting, raw, kafka_defaults[setting])))
        elif key not in _KNOWN and key not in _SPARK_INJECTED:
            raise _fail(
                key,
                "unknown option; known: bootstrap.servers, subscribe, "
                "subscribePattern, assign, startingOffsets, endingOffsets, "
                "startingTimestamp, startingOffsetsByTimestamp, endingTimestamp, endingOffsetsByTimestamp, "
                "startingOffsetsByTimestampStrategy, maxOffsetsPerTrigger, minOffsetsPerTrigger, maxTriggerDelay, "
                "minPartitions, maxPartitions, minRecordsPerPartition, maxRecordsPerPartition, failOnDataLoss, "
                "includeHeaders, groupIdPrefix, kafkaConsumer.pollTimeoutMs, fetchOffset.numRetries, "
                "fetchOffset.retryIntervalMs, maxRecordsPerBatch, value.format, value.schema, kafka.*",
            )
    return kafka_params


def _bootstrap(opts: Mapping[str, str]) -> str:
    """``bootstrap.servers`` (or ``kafka.bootstrap.servers``, not both differently), checked."""
    servers = [opts.get(k, "").strip() for k in ("bootstrap.servers", "kafka.bootstrap.servers")]
    if servers[0] and servers[1] and servers[0] != servers[1]:
        raise _fail("bootstrap.servers", "differs from kafka.bootstrap.servers; give one")
    bootstrap = servers[0] or servers[1]
    if not bootstrap:
        raise _fail("bootstrap.servers", "is required (host:port[,host:port...])")
    for hp in bootstrap.split(","):
        host, _, port = hp.strip().rpartition(":")
        if not host or not port.isdigit():
            raise _fail("bootstrap.servers", f"expected host:port entries, got {hp.strip()!r}")
    return bootstrap


_Subscription = tuple[
    tuple[str, ...] | None,  # subscribe
    str | None,  # subscribePattern
    tuple[tuple[str, tuple[int, ...]], ...] | None,  # assign
]


def _subscription(opts: Mapping[str, str]) -> _Subscription:
    """Exactly one of subscribe, subscribePattern, assign: (topics, pattern, assignment), the others None."""
    chosen = [k for k in ("subscribe", "subscribepattern", "assign") if opts.get(k, "").strip()]
    if len(chosen) != 1:
        raise _fail(
            "subscribe",
            "give exactly one of subscribe, subscribePattern, assign"
            + (f" (got {', '.join(chosen)})" if chosen else ""),
        )
    if chosen[0] == "subscribe":
        subscribe = tuple(sorted({t.strip() for t in opts["subscribe"].split(",") if t.strip()}))
        if not subscribe:
            raise _fail("subscribe", "expected a comma-separated list of topics")
        return subscribe, None, None
    if chosen[0] == "subscribepattern":
        subscribe_pattern = opts["subscribepattern"].strip()
        try:
            re.compile(subscribe_pattern)
        except re.error as e:
            raise _fail("subscribePattern", f"not a valid regular expression: {e}") from None
        return None, subscribe_pattern, None
    return None, None, _parse_assign(opts["assign"])


def _offset_bounds(opts: Mapping[str, str], streaming: bool | None) -> tuple[OffsetSpec, OffsetSpec]:
    """(startingOffsets, endingOffsets), with the checks of a batch or a streaming read."""
    starting = _parse_offsets_json(
        "startingOffsets", opts.get("startingoffsets") or ("earliest" if streaming is False else "latest")
    )
    ending = _parse_offsets_json("endingOffsets", opts.get("endingoffsets") or "latest")
    if streaming is True and opts.get("endingoffsets"):
        raise _fail("endingOffsets", "applies to batch reads only (spark.read); a stream reads until stopped")
    if streaming is False:
        if starting == "latest" or (isinstance(starting, tuple) and any(o == LATEST for _, o in starting)):
            raise _fail("startingOffsets", "latest (-1) is not allowed in a batch read")
        if ending == "earliest" or (isinstance(ending, tuple) and any(o == EARLIEST for _, o in ending)):
            raise _fail("endingOffsets", "earliest (-2) is not allowed in a batch read")
        if opts.get("maxoffsetspertrigger"):
            raise _fail("maxOffsetsPerTrigger", "applies to streaming reads only")
    return starting, ending


def _partition_bounds(opts: Mapping[str, str]) -> tuple[int | None, int | None]:
    """(minPartitions, maxPartitions), each None when not given; min above max refused."""
    min_parts = _int_option(opts, "minpartitions", "minPartitions", minimum=1, default=None)
    max_parts = _int_option(opts, "maxpartitions", "maxPartitions", minimum=1, default=None)
    if min_parts and max_parts and min_parts > max_parts:
        raise _fail(
            "maxPartitions",
            f"is {max_parts}, below minPartitions={min_parts}; give "
            f"one of them, or a maxPartitions at least minPartitions",
        )
    return min_parts, max_parts


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
    opts = {str(k).lower(): v for k, v in options.items()}
    kafka_params = sorted(check_security(dict(_kafka_params(opts))).items())
    bootstrap = _bootstrap(opts)
    subscribe, subscribe_pattern, assign = _subscription(opts)
    starting, ending = _offset_bounds(opts, streaming)
    min_parts, max_parts = _partition_bounds(opts)
    _check_group_options(opts)
    return KafkaOptions(
        bootstrap_servers=bootstrap,
        subscribe=subscribe,
        subscribe_pattern=subscribe_pattern,
        assign=assign,
        starting_offsets=starting,
        ending_offsets=ending,
        max_offsets_per_trigger=_int_option(
            opts, "maxoffsetspertrigger", "maxOffsetsPerTrigger", minimum=1, default=None
        ),
        min_partitions=min_parts,
        max_partitions=max_parts,
        min_records_per_partition=_int_option(
            opts,
            "minrecordsperpartition",
            "minRecordsPerPartition",
            minimum=1,
            default=DEFAULT_MIN_RECORDS_PER_PARTITION,
        ),
        fail_on_data_loss=_bool_option(opts, "failondataloss", "failOnDataLoss", True),
        poll_timeout_ms=_int_option(
            opts, "kafkaconsumer.polltimeoutms", "kafkaConsumer.pollTimeoutMs", minimum=1, default=120_000
        ),
        fetch_offset_num_retries=_int_option(
            opts, "fetchoffset.numretries", "fetchOffset.numRetries", minimum=1, default=3
        ),
        fetch_offset_retry_interval_ms=_int_option(
            opts, "fetchoffset.retryintervalms", "fetchOffset.retryIntervalMs", minimum=0, default=1000
        ),
        max_records_per_batch=_int_option(opts, "maxrecordsperbatch", "maxRecordsPerBatch", minimum=1, default=10_000),
        kafka_params=_KafkaParams(kafka_params),
        value_fields=_value_fields(opts),
        include_headers=_bool_option(opts, "includeheaders", "includeHeaders", False),
        max_records_per_partition=_max_records_per_partition(opts, max_parts),
        **_timestamps(opts, streaming),
        **_trigger_bounds(opts, streaming),
    )


def _parse_timestamps_json(name: str, raw: str) -> TimestampSpec:
    """``{"topic": {"0": 1700000000000}}``: a timestamp (ms, >= 0) per topic-partition."""
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not doc or not all(isinstance(v, dict) and v for v in doc.values()):
        raise _fail(name, f'expected JSON like {{"topic": {{"0": 1700000000000}}}}, got {raw!r}')
    pairs: list[tuple[tuple[str, int], int]] = []
    for topic, parts in doc.items():
        for p, ts in parts.items():
            if not str(p).isdigit() or isinstance(ts, bool) or not isinstance(ts, int) or ts < 0:
                raise _fail(name, f"{topic}[{p}] needs a partition number and a timestamp in ms >= 0, got {ts!r}")
            pairs.append(((topic, int(p)), ts))
    return tuple(sorted(pairs))


def _timestamp_spec(opts: Mapping[str, str], word: str) -> TimestampSpec | None:
    """``<word>Timestamp`` (wins, as in Spark) or ``<word>OffsetsByTimestamp``, or None."""
    one = opts.get(f"{word}timestamp")
    if one is not None and str(one).strip():
        text = str(one).strip()
        if not text.isdigit():
            raise _fail(f"{word}Timestamp", f"expected milliseconds since the epoch (an integer >= 0), got {one!r}")
        return int(text)
    by_partition = opts.get(f"{word}offsetsbytimestamp")
    if by_partition is not None and str(by_partition).strip():
        return _parse_timestamps_json(f"{word}OffsetsByTimestamp", str(by_partition))
    return None


def _timestamps(opts: Mapping[str, str], streaming: bool | None) -> dict[str, Any]:
    """``starting_timestamps``, ``ending_timestamps`` and ``timestamp_strategy`` of the options."""
    strategy = str(opts.get("startingoffsetsbytimestampstrategy") or "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise _fail("startingOffsetsByTimestampStrategy", f"expected error (the default) or latest, got {strategy!r}")
    ending = _timestamp_spec(opts, "ending")
    if streaming is True and ending is not None:
        option = "endingTimestamp" if isinstance(ending, int) else "endingOffsetsByTimestamp"
        raise _fail(option, "applies to batch reads only (spark.read); a stream reads until stopped")
    return {
        "starting_timestamps": _timestamp_spec(opts, "starting"),
        "ending_timestamps": ending,
        "timestamp_strategy": strategy,
    }


def parse_duration_ms(option: str, raw: str) -> int:
    """Spark's time strings: ``15m``, ``30s``, ``500ms``, ``2h``, ``1d``; a bare number is ms."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", str(raw).lower())
    if not m or m.group(2) not in ("", *_TIME_UNITS_MS):
        raise _fail(option, f"expected a duration like 15m, 30s or 500ms, got {raw!r}")
    return int(int(m.group(1)) * _TIME_UNITS_MS.get(m.group(2) or "ms", 1))


def _trigger_bounds(opts: Mapping[str, str], streaming: bool | None) -> dict[str, Any]:
    """``minOffsetsPerTrigger`` and ``maxTriggerDelay``, checked against ``maxOffsetsPerTrigger``."""
    low = _int_option(opts, "minoffsetspertrigger", "minOffsetsPerTrigger", minimum=1, default=None)
    high = _int_option(opts, "maxoffsetspertrigger", "maxOffsetsPerTrigger", minimum=1, default=None)
    delay = opts.get("maxtriggerdelay")
    if streaming is False:
        for key, name in (("minoffsetspertrigger", "minOffsetsPerTrigger"), ("maxtriggerdelay", "maxTriggerDelay")):
            if opts.get(key):
                raise _fail(name, "applies to streaming reads only")
    if low and high and low > high:
        raise _fail("minOffsetsPerTrigger", f"is {low}, above maxOffsetsPerTrigger={high}")
    delay_ms = DEFAULT_MAX_TRIGGER_DELAY_MS if delay is None else parse_duration_ms("maxTriggerDelay", delay)
    return {"min_offsets_per_trigger": low, "max_trigger_delay_ms": delay_ms}


def _max_records_per_partition(opts: Mapping[str, str], max_parts: int | None) -> int | None:
    """``maxRecordsPerPartition``; refused with ``maxPartitions`` (one caps records, the other tasks)."""
    value = _int_option(opts, "maxrecordsperpartition", "maxRecordsPerPartition", minimum=1, default=None)
    if value and max_parts:
        raise _fail(
            "maxRecordsPerPartition",
            "cannot be combined with maxPartitions: one splits ranges, the other packs them; give one",
        )
    return value


def _check_group_options(opts: Mapping[str, str]) -> None:
    """``groupIdPrefix`` and ``kafka.group.id``: accepted as Spark's source takes them, never
    sent (the source joins no group and commits no offsets), but not empty."""
    for key, name in (("groupidprefix", "groupIdPrefix"), ("kafka.group.id", "kafka.group.id")):
        if key in opts and not str(opts[key]).strip():
            raise _fail(name, "is empty")


def _value_fields(opts: Mapping[str, str]) -> ValueFields | None:
    """``value.format`` and ``value.schema``: the fields of decoded JSON values, or None."""
    fmt = str(opts.get("value.format", "binary")).strip().lower()
    schema = opts.get("value.schema")
    if fmt == "binary":
        if schema is not None:
            raise _fail("value.schema", "is only read with value.format=json")
        return None
    if fmt != "json":
        raise _fail("value.format", f"expected binary (the default) or json, got {opts['value.format']!r}")
    if schema is None:
        raise _fail("value.schema", "is required with value.format=json: the fields to decode, as `name TYPE, ...`")
    return parse_value_schema(str(schema))
