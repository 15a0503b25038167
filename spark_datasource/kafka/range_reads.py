"""What both clients' reads of a planned offset range share (executors).

The kafka-python read (:mod:`spark_datasource.kafka.fetch`) and the librdkafka read
(:mod:`spark_datasource.kafka.librdkafka_fetch`) decide the same way where to go on
after an offset out of range (data loss, ``failOnDataLoss``), fail the same way when
records they know exist do not come within ``kafkaConsumer.pollTimeoutMs``, and time
themselves with the same clock.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable

import pyarrow as pa

from spark_datasource.kafka.errors import KafkaDataLossError, KafkaUnavailableError
from spark_datasource.kafka.offsets import KafkaOffsetRange
from spark_datasource.kafka.options import KafkaOptions

__all__ = ["ReadClock", "no_records_error", "resume_after_out_of_range"]

log = logging.getLogger("spark_datasource.kafka.fetch")


@dataclasses.dataclass
class ReadClock:
    """Where one range's read spent its time (for the DEBUG line of
    :func:`spark_datasource.kafka.fetch.read_range`)."""

    started: float
    checked_out: float = 0.0
    first_records: float = 0.0
    arrow_s: float = 0.0
    rows: int = 0

    def ms(self, t: float) -> float:
        return (t - self.started) * 1000 if t else 0.0

    def saw_records(self) -> None:
        """Note the first records' arrival (once)."""
        if not self.first_records:
            self.first_records = time.monotonic()

    def timed_batch(
        self,
        build: Callable[[list[Any], str, int, pa.Schema], pa.RecordBatch],
        records: list[Any],
        rng: KafkaOffsetRange,
        schema: pa.Schema,
    ) -> pa.RecordBatch:
        """``build(records, topic, partition, schema)`` of range ``rng``, its time and rows counted."""
        t = time.monotonic()
        batch = build(records, rng.topic, rng.partition, schema)
        self.arrow_s += time.monotonic() - t
        self.rows += batch.num_rows
        return batch


def resume_after_out_of_range(opts: KafkaOptions, rng: KafkaOffsetRange, pos: int, begin: int, end: int) -> int:
    """Where to continue after the broker said ``pos`` is out of range, its log being
    ``[begin, end)`` now (executor, either client).

    Raises
    ------
    KafkaDataLossError
        Records of the range are gone and ``failOnDataLoss`` is true.
    """
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


def no_records_error(opts: KafkaOptions, rng: KafkaOffsetRange, pos: int) -> KafkaUnavailableError:
    """The error of a read that waited ``kafkaConsumer.pollTimeoutMs`` for records it knows exist."""
    return KafkaUnavailableError(
        f"kafka_py: no records from {rng.topic}[{rng.partition}] at offset {pos} "
        f"(range ends at {rng.end}) within kafkaConsumer.pollTimeoutMs="
        f"{opts.poll_timeout_ms}; bootstrap.servers={opts.bootstrap_servers}"
    )
