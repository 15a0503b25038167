"""The parsers of ``kafka_py``'s offset and timestamp options (Spark's JSON forms).

``startingOffsets``/``endingOffsets`` (``earliest``, ``latest`` or
``{"topic": {"0": 23}}``), ``assign`` (``{"topic": [0, 1]}``) and the timestamps
(``startingTimestamp``, ``{"topic": {"0": 1700000000000}}``), each a
:class:`~spark_datasource.options.spec.Parser` of the declarations in
:mod:`spark_datasource.kafka.option_specs`. Pure; they run on the driver.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from spark_datasource.options.spec import Expected, Parser

__all__ = [
    "EARLIEST",
    "LATEST",
    "TopicPartitionOffsets",
    "OffsetSpec",
    "TimestampSpec",
    "OFFSETS",
    "ASSIGN",
    "TIMESTAMP_MS",
    "TIMESTAMPS_BY_PARTITION",
]

#: Offsets keyed by (topic, partition). -2 means earliest, -1 latest (Spark's JSON).
TopicPartitionOffsets = Mapping[tuple[str, int], int]
#: ``"earliest"``, ``"latest"`` or explicit offsets per topic-partition.
OffsetSpec = str | tuple[tuple[tuple[str, int], int], ...]
#: A timestamp (ms since the epoch) for every partition read (``startingTimestamp``), or
#: one per topic-partition (``startingOffsetsByTimestamp``).
TimestampSpec = int | tuple[tuple[tuple[str, int], int], ...]

EARLIEST = -2
LATEST = -1


def _json_object(text: str, expected: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not doc:
        raise Expected(expected)
    return doc


def _offsets(text: str) -> OffsetSpec:
    if text.strip().lower() in ("earliest", "latest"):
        return text.strip().lower()
    doc = _json_object(text, 'earliest, latest or a non-empty JSON object like {"topic": {"0": 23, "1": -2}}')
    pairs: list[tuple[tuple[str, int], int]] = []
    for topic, parts in doc.items():
        if not isinstance(parts, dict):
            raise Expected(f"topic {topic!r} to map to an object of partition -> offset")
        for p, off in parts.items():
            if not str(p).isdigit():
                raise Expected(f"partition numbers; {p!r} of topic {topic!r} is not one")
            if isinstance(off, bool) or not isinstance(off, int) or off < EARLIEST:
                raise Expected(f"the offset of {topic}[{p}] to be an integer >= -2 (-2 earliest, -1 latest)")
            pairs.append(((topic, int(p)), off))
    return tuple(sorted(pairs))


def _assign(text: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    doc = _json_object(text, 'a non-empty JSON object like {"topic": [0, 1]}')
    out = []
    for topic, parts in doc.items():
        if (
            not isinstance(parts, list)
            or not parts
            or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in parts)
        ):
            raise Expected(f"topic {topic!r} to map to a non-empty list of partition numbers")
        out.append((topic, tuple(sorted(set(parts)))))
    return tuple(sorted(out))


def _timestamp_ms(text: str) -> int:
    if not text.strip().isdigit():
        raise ValueError()
    return int(text.strip())


def _timestamps_by_partition(text: str) -> TimestampSpec:
    """``{"topic": {"0": 1700000000000}}``: a timestamp (ms, >= 0) per topic-partition."""
    doc = _json_object(text, 'JSON like {"topic": {"0": 1700000000000}}')
    if not all(isinstance(v, dict) and v for v in doc.values()):
        raise Expected('JSON like {"topic": {"0": 1700000000000}}')
    pairs: list[tuple[tuple[str, int], int]] = []
    for topic, parts in doc.items():
        for p, ts in parts.items():
            if not str(p).isdigit() or isinstance(ts, bool) or not isinstance(ts, int) or ts < 0:
                raise Expected(f"{topic}[{p}] to have a partition number and a timestamp in ms >= 0")
            pairs.append(((topic, int(p)), ts))
    return tuple(sorted(pairs))


OFFSETS: Parser[OffsetSpec] = Parser('earliest, latest or JSON like {"topic": {"0": 23, "1": -2}}', _offsets)
ASSIGN = Parser('JSON like {"topic": [0, 1]}', _assign)
TIMESTAMP_MS = Parser("milliseconds since the epoch (an integer >= 0)", _timestamp_ms)
TIMESTAMPS_BY_PARTITION = Parser('JSON like {"topic": {"0": 1700000000000}}', _timestamps_by_partition)
