"""The executors' read of a planned range through librdkafka (``kafka.client=librdkafka``).

The same contract as kafka-python's read in :mod:`spark_datasource.kafka.fetch`: records
``[start, end)`` of one partition, nothing past ``end`` even if the partition has grown,
offsets that hold no visible record (transaction markers, aborted or compacted records
under ``read_committed``) skipped, records gone before they were read reported by
``failOnDataLoss``, and a read that gets no record it knows exists for
``kafkaConsumer.pollTimeoutMs`` failed. librdkafka (``confluent_kafka``) fetches and
parses in its own C threads; the source takes up to ``maxRecordsPerBatch`` messages per
``consume`` call and builds each Arrow column with one C-level ``map``
(:func:`spark_datasource.kafka.arrow.messages_to_batch`).

A consumer is assigned its partition at the range's exact start on every read (an
assignment with an offset: no seek, no offset lookup) and unassigned when it goes back
to the pool (:mod:`spark_datasource.kafka.consumers`), which stops librdkafka's
background fetching while it is idle. confluent_kafka is imported inside the functions.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Iterator

import pyarrow as pa

from spark_datasource.kafka.arrow import arrow_schema, messages_to_batch
from spark_datasource.kafka.errors import KafkaAuthenticationError, KafkaUnavailableError
from spark_datasource.kafka.librdkafka_settings import librdkafka_config
from spark_datasource.kafka.offsets import KafkaOffsetRange
from spark_datasource.kafka.options import KafkaOptions
from spark_datasource.kafka.range_reads import ReadClock, no_records_error, resume_after_out_of_range
from spark_datasource.kafka.security import LIBRDKAFKA_LOGGER, redact_secrets_in_logs

__all__ = ["new_librdkafka_consumer", "read_records_librdkafka", "park", "close_librdkafka"]

log = logging.getLogger(__name__)


def new_librdkafka_consumer(opts: KafkaOptions) -> Any:
    """An unassigned ``confluent_kafka.Consumer`` for ``opts`` (executor).

    librdkafka connects on first use, so this neither blocks nor retries; its log lines
    go to this module's logger, with passwords masked.

    Raises
    ------
    KafkaUnavailableError
        librdkafka refused the settings (a TLS file it cannot load, for one).
    """
    from confluent_kafka import Consumer, KafkaException

    kp_cfg = opts.consumer_config()
    redact_secrets_in_logs(kp_cfg)
    cfg = librdkafka_config(kp_cfg, opts.max_records_per_batch)
    cfg["logger"] = logging.getLogger(LIBRDKAFKA_LOGGER)
    try:
        return Consumer(cfg)
    except KafkaException as e:
        raise KafkaUnavailableError(
            f"kafka_py: librdkafka could not create a consumer for bootstrap.servers={opts.bootstrap_servers}: "
            f"{e.args[0].str() if e.args else e}"
        ) from None


def park(consumer: Any) -> None:
    """Stop a pooled consumer's background fetching: drop its assignment (executor)."""
    consumer.unassign()


def close_librdkafka(consumer: Any) -> None:
    """Close a librdkafka consumer (it never joined a group: nothing to leave or commit)."""
    consumer.close()


def read_records_librdkafka(
    opts: KafkaOptions, consumer: Any, rng: KafkaOffsetRange, clock: ReadClock, pooled: bool
) -> Iterator[pa.RecordBatch]:
    """The fetch loop of :func:`spark_datasource.kafka.fetch.read_range` on librdkafka (executor).

    ``pooled`` does not matter here: every read assigns the partition at its start.
    """
    from confluent_kafka import TopicPartition

    del pooled
    schema = arrow_schema(opts.value_fields, opts.include_headers)
    tp = TopicPartition(rng.topic, rng.partition)
    pos = rng.start
    consumer.assign([TopicPartition(rng.topic, rng.partition, pos)])
    wait_s = min(1000, opts.poll_timeout_ms) / 1000
    deadline = time.monotonic() + opts.poll_timeout_ms / 1000
    while pos < rng.end:
        # Never more than the range still holds: with no gaps that is exactly its end.
        messages = _next_messages(consumer, min(opts.max_records_per_batch, rng.end - pos), wait_s)
        restart = None
        if messages:
            messages, restart = _without_errors(opts, consumer, rng, messages)
        if messages:
            clock.saw_records()
            deadline = time.monotonic() + opts.poll_timeout_ms / 1000
            if messages[-1].offset() >= rng.end:  # past a gap: the rest belongs to the next range
                messages = [m for m in messages if m.offset() < rng.end]
            if messages:
                yield clock.timed_batch(messages_to_batch, messages, rng, schema)
                pos = messages[-1].offset() + 1
            else:
                pos = rng.end
        if restart is not None:  # after an offset out of range: from where the log allows
            pos = max(pos, restart)
            if pos < rng.end:
                consumer.assign([TopicPartition(rng.topic, rng.partition, pos)])
            continue
        # Transaction markers and compacted-away offsets advance the position without
        # messages (librdkafka moves it past the control records it consumed).
        if pos < rng.end:
            position = consumer.position([tp])[0].offset
            if position > pos:
                pos = position
        if pos < rng.end and not messages and time.monotonic() > deadline:
            raise no_records_error(opts, rng, pos)


def _next_messages(consumer: Any, most: int, wait_s: float) -> list[Any]:
    """Up to ``most`` messages: those already fetched, else the first to arrive within
    ``wait_s`` and those fetched with it.

    ``consume(n, timeout)`` alone waits until it has ``n`` messages or the timeout has
    passed; librdkafka's prefetch stops near ``queued.min.messages``, so a full batch
    can take the whole timeout to come. kafka-python's ``poll`` returns what it has.
    """
    messages: list[Any] = consumer.consume(num_messages=most, timeout=0)
    if messages:
        return messages
    first = consumer.poll(wait_s)
    if first is None:
        return []
    return [first, *consumer.consume(num_messages=most - 1, timeout=0)] if most > 1 else [first]


def _without_errors(
    opts: KafkaOptions, consumer: Any, rng: KafkaOffsetRange, messages: list[Any]
) -> tuple[list[Any], int | None]:
    """``messages`` without the error events among them, and where to restart the read
    (None: go on) after an offset out of range (executor).

    Raises
    ------
    KafkaDataLossError
        The out-of-range offsets were deleted and ``failOnDataLoss`` is true.
    KafkaAuthenticationError
        The broker refused the credentials.
    KafkaUnavailableError
        librdkafka reported a fatal error.
    """
    from confluent_kafka import KafkaError, Message, TopicPartition

    errors = list(map(Message.error, messages))
    # any() rather than count(None): KafkaError's == leaves a TypeError set against None.
    if not any(errors):
        return messages, None
    good = [m for m, e in zip(messages, errors) if e is None]
    for m, e in zip(messages, errors):
        if e is None:
            continue
        if e.code() == KafkaError._AUTO_OFFSET_RESET:
            failed = m.offset() if m.offset() is not None and m.offset() >= 0 else rng.start
            begin, end = consumer.get_watermark_offsets(
                TopicPartition(rng.topic, rng.partition), timeout=opts.poll_timeout_ms / 1000, cached=False
            )
            return good, resume_after_out_of_range(opts, rng, failed, int(begin), int(end))
        if e.code() in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED):
            raise KafkaAuthenticationError(
                f"kafka_py option 'kafka.sasl.plain.password': librdkafka could not authenticate to "
                f"bootstrap.servers={opts.bootstrap_servers} ({e.str()})"
            )
        if e.fatal():
            raise KafkaUnavailableError(f"kafka_py: librdkafka failed reading {rng.topic}[{rng.partition}]: {e.str()}")
        # Transport errors and the like: librdkafka retries them itself; the poll timeout bounds the wait.
        log.debug("kafka_py: librdkafka reported %s while reading %s[%d]", e.str(), rng.topic, rng.partition)
    return good, None
