"""Offset planning of the ``kafka_py`` source (driver; pure).

Everything here is a function of offsets and options: no pyspark, no broker I/O
(timestamp lookups come in as a callable), so it is unit-tested with scripted offsets
(``tests/unit/test_kafka_offsets.py``). It decides

- how offsets are written to Spark's checkpoint (:func:`to_json_offsets`, plain JSON
  ``{"topic": {"partition": next_offset}}`` with topics and partitions in a fixed
  order, and :data:`START_KEY`);
- where a read starts and a batch read ends (:func:`resolve_bound`);
- the end offsets of the next micro-batch (:func:`plan_end_offsets`, with
  ``maxOffsetsPerTrigger`` and ``failOnDataLoss``);
- how a batch's records are cut into Spark partitions (:func:`plan_partitions`, with
  ``minPartitions``, ``maxRecordsPerPartition``, ``maxPartitions`` and
  ``minRecordsPerPartition``).

Being pure is what makes a micro-batch replayed after a crash read exactly the same
records in exactly the same Spark partitions: the property the clickhouse_tx sink's
exactly-once argument needs (`docs/design.md` §5).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Iterable, Mapping, Sequence, cast

from clickhouse_tx.errors import ConfigurationError
from spark_datasource.kafka.errors import KafkaDataLossError
from spark_datasource.kafka.offset_parsers import EARLIEST, LATEST
from spark_datasource.kafka.options import KafkaOptions

log = logging.getLogger(__name__)

#: A topic-partition: (topic, partition).
TP = tuple[str, int]


@dataclasses.dataclass(frozen=True)
class KafkaOffsetRange:
    """Records ``[start, end)`` of one topic-partition: what one Spark partition reads.

    Built on the driver by :func:`plan_ranges`, pickled to an executor inside a
    ``KafkaInputPartition`` (:mod:`spark_datasource.kafka.reader`).
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
class KafkaRangeGroup:
    """Several whole offset ranges one Spark partition reads, one after the other.

    Built by :func:`group_ranges` when ``maxPartitions`` is below the number of ranges.
    """

    ranges: tuple[KafkaOffsetRange, ...]


#: What one Spark partition reads: one offset range, or a group of them in order.
PlannedPartition = KafkaOffsetRange | KafkaRangeGroup


def group_ranges(ranges: Sequence[KafkaOffsetRange], max_partitions: int | None) -> list[PlannedPartition]:
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


def plan_partitions(start: Mapping[TP, int], end: Mapping[TP, int], opts: KafkaOptions) -> list[PlannedPartition]:
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
    tps: Sequence[TP],
    earliest: Mapping[TP, int],
    latest: Mapping[TP, int],
    offsets_for_times: Callable[[Mapping[TP, int]], Mapping[TP, int | None]],
    *,
    starting: bool,
) -> dict[TP, int]:
    """Where a read starts (or a batch read ends): by timestamp when one is given, else by offset (driver).

    ``offsets_for_times`` looks timestamps up at the broker
    (:meth:`spark_datasource.kafka.consumers.ClusterMetadata.offsets_for_times`); it is
    called only when the options give a timestamp.
    """
    spec = opts.starting_timestamps if starting else opts.ending_timestamps
    if spec is None:
        offsets = opts.starting_offsets if starting else opts.ending_offsets
        return resolve_offsets(offsets, tps, earliest, latest, "startingOffsets" if starting else "endingOffsets")
    option = opts.timestamp_option(starting)
    stamps = {tp: spec for tp in tps} if isinstance(spec, int) else _covering(spec, tps, option)
    return place_timestamps(offsets_for_times(stamps), latest, opts, starting)


def _fmt_tps(tps: Sequence[TP]) -> str:
    return ", ".join(f"{t}[{p}]" for t, p in tps)
