"""The ``kafka_py`` source's options, each declared once.

Each :class:`~spark_datasource.options.spec.OptionSpec` holds one option's name (as
Spark's own Kafka source spells it, where it has one), default, parser and the line
of the options table of ``docs/kafka.md``, which is generated from
:data:`KAFKA_OPTIONS`. :mod:`spark_datasource.kafka.options` parses the options
with these declarations, on the driver, when the DataFrame is defined.
"""

from __future__ import annotations

import re
from typing import Any

from clickhouse_tx.errors import ConfigurationError
from spark_datasource.kafka.offset_parsers import ASSIGN, OFFSETS, TIMESTAMP_MS, TIMESTAMPS_BY_PARTITION
from spark_datasource.options.spec import (
    BOOL,
    DURATION_MS,
    POSITIVE_INT,
    TEXT,
    Expected,
    OptionFamily,
    OptionSpec,
    Parser,
    int_at_least,
    one_of,
)

__all__ = ["KAFKA_OPTIONS", "SOURCE", "kafka_option_error"]

#: The prefix of every error of a ``kafka_py`` option.
SOURCE = "kafka_py"


def kafka_option_error(option: str, problem: str) -> ConfigurationError:
    """A ``kafka_py`` option refused by a rule (with other options, or the kind of read).

    A malformed value is refused by its declaration instead
    (:func:`spark_datasource.options.spec.bad_value`).
    """
    return ConfigurationError(f"{SOURCE} option {option!r}: {problem}")


def _host_ports(text: str) -> str:
    for hp in text.split(","):
        host, _, port = hp.strip().rpartition(":")
        if not host or not port.isdigit():
            raise Expected(f"host:port entries ({hp.strip()!r} is not one)")
    return text.strip()


def _topics(text: str) -> tuple[str, ...]:
    topics = tuple(sorted({t.strip() for t in text.split(",") if t.strip()}))
    if not topics:
        raise ValueError()
    return topics


def _pattern(text: str) -> str:
    try:
        re.compile(text.strip())
    except re.error as e:
        raise Expected(f"a valid regular expression ({e})") from None
    return text.strip()


HOST_PORTS = Parser("host:port[,host:port...]", _host_ports)
TOPICS = Parser("a comma-separated list of topics", _topics)
PATTERN = Parser("a valid regular expression", _pattern)
SET_BY_SPARK = Parser("anything", lambda text: text)
#: ``groupIdPrefix``, ``kafka.group.id``: accepted and never sent, but not empty.
GROUP_ID = Parser("a non-empty group id (accepted, never sent)", TEXT.convert)


def _kafka(name: str, default: Any, parser: Parser[Any], doc: str, **more: Any) -> OptionSpec[Any]:
    return OptionSpec(name, default, parser, doc, source=SOURCE, **more)


#: Every ``kafka_py`` option, in the order of the docs' table.
_SPECS: tuple[OptionSpec[Any], ...] = (
    _kafka(
        "bootstrap.servers",
        None,
        HOST_PORTS,
        "`host:port[,host:port]`",
        aliases=("kafka.bootstrap.servers",),
        shown_default="required",
    ),
    _kafka(
        "subscribe",
        None,
        TOPICS,
        "comma-separated topics. Exactly one of `subscribe`, `subscribePattern`, `assign`",
        shown_default="—",
        blank_is_default=True,
    ),
    _kafka(
        "subscribePattern",
        None,
        PATTERN,
        "Python regex, matched in full against topic names, re-evaluated every trigger",
        shown_default="—",
        blank_is_default=True,
    ),
    _kafka(
        "assign",
        None,
        ASSIGN,
        'JSON `{"topic": [0, 1]}`: exactly these partitions',
        shown_default="—",
        blank_is_default=True,
    ),
    _kafka(
        "startingOffsets",
        None,
        OFFSETS,
        '`earliest`, `latest`, or JSON `{"topic": {"0": 23, "1": -2}}` (-2 earliest, -1 latest). JSON must list every'
        " partition read. A stream uses it only when its checkpoint is new",
        shown_default="stream: `latest`, batch: `earliest`",
        blank_is_default=True,
    ),
    _kafka(
        "endingOffsets",
        "latest",
        OFFSETS,
        "batch reads only; same forms (`earliest`/-2 not allowed)",
        blank_is_default=True,
    ),
    _kafka(
        "startingTimestamp",
        None,
        TIMESTAMP_MS,
        "ms since the epoch: every partition read starts at its first record whose timestamp is at or after it "
        "(Kafka's lookup by timestamp, `ListOffsets`). Wins over `startingOffsetsByTimestamp`, which wins over "
        "`startingOffsets` (Spark's order). A stream uses it only when its checkpoint is new",
        shown_default="—",
        blank_is_default=True,
    ),
    _kafka(
        "startingOffsetsByTimestamp",
        None,
        TIMESTAMPS_BY_PARTITION,
        'JSON `{"topic": {"0": 1700000000000}}`: a timestamp (ms, >= 0) per partition; must list every partition read',
        shown_default="—",
        blank_is_default=True,
    ),
    _kafka(
        "startingOffsetsByTimestampStrategy",
        "error",
        one_of("error", "latest"),
        "a partition with no record at or after its starting timestamp: `error` fails the read on the driver "
        "(`ConfigurationError` naming the option and the partitions); `latest` starts it at its latest offset",
        field="timestamp_strategy",
        blank_is_default=True,
    ),
    _kafka(
        "endingTimestamp",
        None,
        TIMESTAMP_MS,
        "ms since the epoch, batch reads only: each partition ends (excluded) at its first record at or after the "
        "timestamp, or at its latest offset when there is none; precedence as for the starting ones (over "
        "`endingOffsetsByTimestamp`, which wins over `endingOffsets`)",
        shown_default="—",
        blank_is_default=True,
    ),
    _kafka(
        "endingOffsetsByTimestamp",
        None,
        TIMESTAMPS_BY_PARTITION,
        'batch reads only: JSON `{"topic": {"0": 1700000000000}}`, a timestamp (ms, >= 0) per partition, each '
        "partition ending as with `endingTimestamp`; must list every partition read",
        shown_default="—",
        blank_is_default=True,
    ),
    _kafka(
        "minOffsetsPerTrigger",
        None,
        POSITIVE_INT,
        "streaming only: a trigger with fewer new records than this in total (over every partition) runs no batch, "
        "until `maxTriggerDelay` has passed since the last batch. As in Spark, the first trigger after a (re)start is"
        " never delayed, and `Trigger.AvailableNow` ignores it. Above `maxOffsetsPerTrigger` it is refused",
        blank_is_default=True,
    ),
    _kafka(
        "maxTriggerDelay",
        15 * 60 * 1000,
        DURATION_MS,
        "streaming only: the longest a trigger waits for `minOffsetsPerTrigger` records; Spark's durations (`500ms`, "
        "`30s`, `15m`, `2h`, `1d`; a bare number is ms)",
        field="max_trigger_delay_ms",
        shown_default="`15m`",
    ),
    _kafka(
        "maxOffsetsPerTrigger",
        None,
        POSITIVE_INT,
        "streaming only: at most this many records per micro-batch in total, shared between partitions in proportion "
        "to their backlog",
        field="max_offsets_per_trigger",
        blank_is_default=True,
    ),
    _kafka(
        "minPartitions",
        None,
        POSITIVE_INT,
        "split offset ranges so a batch has at least this many Spark partitions (deterministic: the same offsets "
        "always give the same split)",
        blank_is_default=True,
    ),
    _kafka(
        "maxPartitions",
        None,
        POSITIVE_INT,
        "at most this many Spark partitions per batch: whole offset ranges are packed into them, largest first "
        "(deterministic, so a replay plans the same; a range is never split, so each partition's records stay in "
        "order). Fewer tasks per micro-batch, each of which has a fixed cost (see [performance.md](performance.md)). "
        "For throughput, the executors' total cores: one wave of tasks per batch (100,000-record batches on 2 cores "
        "read at 0.86 of the batch job with `maxPartitions=2`, 0.81 with the default cut). Below `minPartitions` it "
        "is refused. Changing it between restarts of a query changes how a replayed batch is partitioned: mode "
        "`dedup` refuses such a replay, and the other modes commit it, except when part of the batch was already "
        'visible (docs/protocol.md, "Replays under another partitioning")',
        blank_is_default=True,
    ),
    _kafka(
        "minRecordsPerPartition",
        20_000,
        POSITIVE_INT,
        "a batch whose offset ranges hold fewer records than this on average is packed into fewer Spark partitions: "
        "whole ranges, the same number in each, enough to hold about this many records (then packed as by "
        "`maxPartitions`). A micro-batch of a few records runs one task instead of one per topic-partition, and "
        "50,000 records over 8 partitions run as 2 tasks of 4 ranges, since each task costs about 90-100 ms of "
        'pyspark\'s time whatever it reads ([performance.md](performance.md), "Tasks per micro-batch"). Equal ranges '
        "give equal tasks: 8 ranges go into 8, 4, 2 or 1 partitions, never 6. `1` gives one Spark partition per "
        "range, as Spark's own source does; a smaller value gives more, smaller tasks (more parallelism for heavy "
        "work in the same stage, on many cores). Not applied when `minPartitions` is given. Deterministic like "
        "`maxPartitions`, and for the same reason, changing it between restarts of a query changes how a replayed "
        "batch is partitioned. A `dedup` query upgraded from an earlier default with a batch in flight: see the note "
        "below the table",
        field="min_records_per_partition",
        blank_is_default=True,
    ),
    _kafka(
        "maxRecordsPerPartition",
        None,
        POSITIVE_INT,
        "as in Spark: each offset range is cut into `ceil(records / maxRecordsPerPartition)` near-equal pieces, one "
        "Spark partition each (then cut further if still fewer than `minPartitions`). Not packed by "
        "`minRecordsPerPartition`; refused with `maxPartitions` (one caps a task's records, the other the number of "
        "tasks). Deterministic, so a replay is cut the same way",
        blank_is_default=True,
    ),
    _kafka(
        "includeHeaders",
        False,
        BOOL,
        "as in Spark: rows have the `headers` column only when `true`. A job that selects `headers` sets "
        "`includeHeaders=true`",
        field="include_headers",
    ),
    _kafka(
        "groupIdPrefix",
        None,
        GROUP_ID,
        "accepted so a job written for Spark's source runs unchanged, and ignored: `kafka_py` assigns partitions "
        "itself, joins no consumer group and commits no offsets, so no group id is ever sent to a broker (Spark's "
        "source sends one, which matters only to brokers that authorise by group ACLs; librdkafka's consumer names a "
        'fixed id of its own, see "Clients"). Empty values are refused',
        shown_default="—",
    ),
    _kafka(
        "kafka.group.id",
        None,
        GROUP_ID,
        "as `groupIdPrefix`: accepted so a job written for Spark's source runs unchanged, and ignored (no group "
        'id is sent to a broker; librdkafka\'s consumer names a fixed id of its own, see "Clients"). An empty '
        "value is refused",
        shown_default="—",
    ),
    _kafka(
        "failOnDataLoss",
        True,
        BOOL,
        "as in Spark's source: records that are gone (deleted by retention before they were read, a deleted topic or "
        "partition, a re-created topic, a partition added after the query started whose first offset is not 0) raise "
        "`KafkaDataLossError`; `false` skips what is gone, logs a warning and reads what is left. Offsets that exist "
        "but hold no visible record (compacted away, aborted transactions, transaction markers) are skipped silently "
        "either way",
        field="fail_on_data_loss",
    ),
    _kafka(
        "kafkaConsumer.pollTimeoutMs",
        120_000,
        POSITIVE_INT,
        "an executor waiting this long for records it knows exist fails with `KafkaUnavailableError`",
        field="poll_timeout_ms",
        blank_is_default=True,
    ),
    _kafka(
        "fetchOffset.numRetries",
        3,
        POSITIVE_INT,
        "attempts for connecting and for each driver-side metadata/offset request",
        field="fetch_offset_num_retries",
        blank_is_default=True,
    ),
    _kafka(
        "fetchOffset.retryIntervalMs",
        1000,
        int_at_least(0),
        "pause between those attempts",
        field="fetch_offset_retry_interval_ms",
        blank_is_default=True,
    ),
    _kafka(
        "maxRecordsPerBatch",
        10_000,
        POSITIVE_INT,
        "largest Arrow batch an executor yields (kafka-python's `max_poll_records`; librdkafka's `consume` size)",
        field="max_records_per_batch",
        blank_is_default=True,
    ),
    _kafka(
        "value.format",
        "binary",
        one_of("binary", "json"),
        "`json`: decode each record's value as one JSON object into the struct `value.schema` describes, on the "
        "executor with Arrow's JSON reader; strict (see below)",
    ),
    _kafka(
        "value.schema",
        None,
        TEXT,
        "required with `value.format=json`, refused without it: flat Spark DDL, `name TYPE, ...` (an optional `:` "
        "after the name, backticks for other names). Types: `BOOLEAN`, `TINYINT`/`BYTE`, `SMALLINT`/`SHORT`, "
        "`INT`/`INTEGER`, `BIGINT`/`LONG`, `FLOAT`/`REAL`, `DOUBLE`, `STRING`. Nested, parameterised "
        "(`DECIMAL(p,s)`), date and timestamp types are refused: decode those with `from_json` on the raw value",
        shown_default="—",
    ),
    _kafka(
        "kafka.client",
        "auto",
        one_of("auto", "kafka-python", "librdkafka"),
        "the client executors read with: `librdkafka` (the C client bundled in `confluent-kafka`, which parses "
        "records in C: several times kafka-python's records/s, see below), `kafka-python`, or `auto`: librdkafka "
        "when `confluent_kafka` imports on the driver and every `kafka.*` setting has a librdkafka equivalent, else "
        "kafka-python. The same offsets, records and errors with either. `librdkafka` without `confluent-kafka` "
        "installed, or with a setting it has no equivalent of, is refused on the driver",
        shown_default="`auto`",
    ),
    _kafka(
        "kafka.<setting>",
        None,
        TEXT,
        "passed to kafka-python with dots as underscores, typed like its default (with `kafka.client=librdkafka`, "
        'translated to librdkafka\'s name: see "Clients" below): `kafka.security.protocol`, '
        '`kafka.ssl.cafile`, `kafka.sasl.mechanism`, `kafka.sasl.plain.password` (see "TLS and SASL" below), '
        "`kafka.request.timeout.ms` (default here 30000), `kafka.isolation.level` (default here `read_committed`, see"
        " below), `kafka.api.version` (`2.5.0`), ... Unknown settings are an error. Not allowed: `auto.offset.reset`,"
        " `enable.auto.commit`, the deserializers, `consumer.timeout.ms` (the source owns them); `kafka.group.id` is "
        "accepted and ignored (above). Values of settings whose names look secret (password, token, ...) never appear"
        " in `repr` or errors",
        shown_default="—",
    ),
    _kafka(
        "path", None, SET_BY_SPARK, "set by Spark from `load(...)`; not read", aliases=("paths",), shown_default="—"
    ),
)
KAFKA_OPTIONS = OptionFamily(SOURCE, "docs/kafka.md", _SPECS)
