"""The executors' read of the ``kafka_py`` source: a planned offset range to Arrow batches.

:func:`read_partition` runs on executors, once per Spark partition and task attempt,
in a reused Python worker. Everything it needs is in the pickled options and the
planned ranges (:mod:`spark_datasource.kafka.offsets`): it takes a consumer from the
worker's pool (:mod:`spark_datasource.kafka.consumers`), seeks to the range's start,
polls up to its end and turns each fetch into one Arrow record batch
(:mod:`spark_datasource.kafka.arrow`). It stops at the range's end even if the
partition has grown since, so every attempt returns the same records.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Iterator

import pyarrow as pa

from spark_datasource.kafka.arrow import arrow_schema, records_to_batch
from spark_datasource.kafka.consumers import POOL, ConsumerPool
from spark_datasource.kafka.librdkafka_fetch import read_records_librdkafka
from spark_datasource.kafka.librdkafka_settings import librdkafka_available
from spark_datasource.kafka.offsets import KafkaOffsetRange, KafkaRangeGroup, PlannedPartition
from spark_datasource.kafka.options import KafkaOptions
from spark_datasource.kafka.range_reads import ReadClock, no_records_error, resume_after_out_of_range

log = logging.getLogger(__name__)


def read_range(opts: KafkaOptions, rng: KafkaOffsetRange, pool: ConsumerPool | None = None) -> Iterator[pa.RecordBatch]:
    """Read records ``[rng.start, rng.end)`` as Arrow record batches (executor).

    Called once per range per (re)try of a task. Stops at ``rng.end`` even if the
    partition has grown since, so every attempt returns the same records. The consumer
    comes from ``pool`` (default: this worker's
    :data:`~spark_datasource.kafka.consumers.POOL`) and goes back to it after a read
    that did not raise; one that raised is closed. Logs, at DEBUG on this module's
    logger, where the read's time went (checkout, first records, Arrow, total).

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
    clock = ReadClock(time.monotonic())
    client = reading_client(opts)
    consumer, reused = pool.checkout(opts, tp, client)
    clock.checked_out = time.monotonic()
    read = _read_records if client == "kafka-python" else read_records_librdkafka
    try:
        yield from read(opts, consumer, rng, clock, reused)
    except GeneratorExit:
        pool.give_back(opts, tp, consumer, client)  # the caller stopped early: the consumer is fine
        raise
    except BaseException:
        pool.discard(consumer, client)
        raise
    pool.give_back(opts, tp, consumer, client)
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "kafka_py: read %s[%d] [%d, %d) with %s: %d rows, consumer %s, checkout %.1f ms, "
            "first records %.1f ms, arrow %.1f ms, total %.1f ms",
            rng.topic,
            rng.partition,
            rng.start,
            rng.end,
            client,
            clock.rows,
            "reused" if reused else "new",
            clock.ms(clock.checked_out),
            clock.ms(clock.first_records),
            clock.arrow_s * 1000,
            clock.ms(time.monotonic()),
        )


def reading_client(opts: KafkaOptions) -> str:
    """The client this executor reads with: the driver's choice, except that a choice
    made by ``kafka.client=auto`` falls back to kafka-python where ``confluent_kafka``
    does not import (an executor installed without it)."""
    if opts.client == "librdkafka" and opts.client_auto and not librdkafka_available():
        return "kafka-python"
    return opts.client


def read_partition(opts: KafkaOptions, planned: PlannedPartition) -> Iterator[pa.RecordBatch]:
    """Read what one Spark partition was planned to read: an offset range, or a group of
    them in order (executor)."""
    ranges = planned.ranges if isinstance(planned, KafkaRangeGroup) else (planned,)
    for rng in ranges:
        yield from read_range(opts, rng)


def _read_records(
    opts: KafkaOptions, consumer: Any, rng: KafkaOffsetRange, clock: ReadClock, pooled: bool
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
            clock.saw_records()
            deadline = time.monotonic() + opts.poll_timeout_ms / 1000
            if records[-1].offset >= rng.end:
                records = [r for r in records if r.offset < rng.end]
            if records:
                yield clock.timed_batch(records_to_batch, records, rng, schema)
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
            raise no_records_error(opts, rng, pos)


def _after_out_of_range(opts: KafkaOptions, consumer: Any, tp: Any, rng: KafkaOffsetRange, pos: int) -> int:
    """Where to continue after the broker said ``pos`` is out of range (executor, kafka-python)."""
    begin = int(consumer.beginning_offsets([tp])[tp])
    end = int(consumer.end_offsets([tp])[tp])
    return resume_after_out_of_range(opts, rng, pos, begin, end)
