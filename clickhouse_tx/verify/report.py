"""What the exactly-once verifier reports: its findings, the partitions it read, the verdict.

Values only (no I/O): :class:`Anomaly` (one finding, built by kind through its
constructors), :class:`PartitionSummary` (what the table holds for one
topic-partition) and :class:`VerifyReport` (everything one run found, as JSON or a few
human lines). Built by :func:`clickhouse_tx.verify.verifier.verify` and
:func:`clickhouse_tx.verify.shards.verify_shards`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

#: A topic-partition: (topic, or None for a table without a topic column; partition).
TP = tuple[str | None, int]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Anomaly:
    """One finding. ``first``/``last`` bound the offsets concerned (inclusive), when known.

    ``topic`` and ``partition`` are None for a finding about the whole table or its
    markers (``double_commit``, ``marker_count_mismatch``, ``decided_not_committed``).
    """

    kind: str
    topic: str | None = None
    partition: int | None = None
    first: int | None = None
    last: int | None = None
    count: int
    detail: str

    @classmethod
    def over(cls, kind: str, tp: TP, first: int, last: int, detail: str, *, count: int | None = None) -> Anomaly:
        """A finding about the offsets ``first..last`` of ``tp``; ``count`` defaults to all of them."""
        n = last - first + 1 if count is None else count
        return cls(kind=kind, topic=tp[0], partition=tp[1], first=first, last=last, count=n, detail=detail)

    @classmethod
    def in_partition(cls, kind: str, tp: TP, count: int, detail: str) -> Anomaly:
        """A finding about ``tp`` whose offsets are not listed (beyond the sample limit)."""
        return cls(kind=kind, topic=tp[0], partition=tp[1], count=count, detail=detail)

    @classmethod
    def of_table(cls, kind: str, count: int, detail: str) -> Anomaly:
        """A finding about the table as a whole (its markers, its decision logs)."""
        return cls(kind=kind, count=count, detail=detail)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class PartitionSummary:
    """What the table holds for one topic-partition."""

    topic: str | None
    partition: int
    rows: int
    distinct: int
    min_offset: int
    max_offset: int
    expected_start: int | None = None
    expected_end: int | None = None  # exclusive: the next offset to be produced

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """Everything :func:`verify` found; ``clean`` is the verdict."""

    table: str
    rows: int
    distinct: int
    partitions: tuple[PartitionSummary, ...]
    anomalies: tuple[Anomaly, ...]
    checks: tuple[str, ...]
    markers: Mapping[str, object] | None = None
    #: The materialized views on the table not checked, each ``{"view", "table", "why"}``.
    views_not_checked: tuple[Mapping[str, str], ...] = ()

    @property
    def clean(self) -> bool:
        return not self.anomalies

    def count(self, kind: str) -> int:
        """Total ``count`` of anomalies of ``kind`` (e.g. duplicate rows, missing offsets)."""
        return sum(a.count for a in self.anomalies if a.kind == kind)

    @property
    def duplicates(self) -> int:
        """Rows beyond the first of every stored offset."""
        return self.count("duplicate")

    @property
    def missing(self) -> int:
        """Offsets that should be stored and are not."""
        return self.count("gap")

    def to_json(self) -> dict[str, Any]:
        kinds = sorted({a.kind for a in self.anomalies})
        return {
            "table": self.table,
            "clean": self.clean,
            "rows": self.rows,
            "distinct": self.distinct,
            "duplicates": self.duplicates,
            "missing": self.missing,
            "counts": {k: self.count(k) for k in kinds},
            "checks": list(self.checks),
            "partitions": [p.to_json() for p in self.partitions],
            "anomalies": [a.to_json() for a in self.anomalies],
            "markers": dict(self.markers) if self.markers is not None else None,
            "views_not_checked": [dict(v) for v in self.views_not_checked],
        }

    def summary(self) -> str:
        """A few human lines: verdict, counts per kind, the first anomalies."""
        head = (
            f"{self.table}: {self.rows} rows, {self.distinct} distinct offsets in "
            f"{len(self.partitions)} partitions; checks: {', '.join(self.checks)}"
        )
        views = [f"  view {v['view']} -> {v['table']} not checked: {v['why']}" for v in self.views_not_checked]
        if self.clean:
            return "\n".join([head, "CLEAN: no duplicates, gaps, overlaps or uncommitted decisions", *views])
        lines = [
            head,
            "ANOMALIES: " + ", ".join(f"{k}={self.count(k)}" for k in sorted({a.kind for a in self.anomalies})),
        ]
        for a in self.anomalies[:20]:
            where = f"{a.topic}[{a.partition}]" if a.partition is not None else "-"
            rng = f" offsets {a.first}..{a.last}" if a.first is not None else ""
            lines.append(f"  {a.kind:<22} {where}{rng}: {a.detail}")
        if len(self.anomalies) > 20:
            lines.append(f"  ... and {len(self.anomalies) - 20} more")
        return "\n".join(lines + views)
