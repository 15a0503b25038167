"""The verifier's checks of the stored Kafka offsets: duplicates, gaps, expected ends, segments.

The pure checks (:func:`runs`, :func:`check_segments`, :func:`check_expected`) take
what was read; :class:`Scan` and :func:`offset_checks` read the target table, one
query per kind of finding, counting exactly and fetching at most ``Scan.limit`` rows
of each kind to describe them. Reads go through the verifier's read-committed reader
(:class:`clickhouse_tx.verify.reader.ClickHouseReader`). Runs in the calling process.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from clickhouse_tx.client.sql import quote_option_identifier as quote_ident  # names come from the CLI
from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.verify.report import TP, Anomaly, PartitionSummary

if TYPE_CHECKING:  # pragma: no cover
    from clickhouse_tx.verify.reader import ClickHouseReader


# --------------------------------------------------------------------------- expected


def parse_expected(spec: str | Mapping[str, Mapping[str, object]] | None) -> dict[TP, tuple[int, int]]:
    """End offsets per topic-partition → ``{(topic, partition): (start, end)}``.

    Accepts ``{"topic": {"0": end, "1": [start, end]}}`` (end exclusive, as Kafka's
    end offsets; start defaults to 0), as JSON text, a path to a JSON file, or a dict.
    """
    if spec is None:
        return {}
    doc: object = spec
    if isinstance(spec, str):
        text = spec
        if not spec.lstrip().startswith("{") and os.path.exists(spec):
            with open(spec) as fh:
                text = fh.read()
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise ConfigurationError(f"--expected is not JSON (or a JSON file): {e}") from None
    if not isinstance(doc, Mapping):
        raise ConfigurationError('--expected must be {"topic": {"partition": end_offset}}')
    out: dict[TP, tuple[int, int]] = {}
    for topic, parts in doc.items():
        if not isinstance(parts, Mapping):
            raise ConfigurationError(f"--expected: topic {topic!r} must map partitions to end offsets")
        for p, v in parts.items():
            try:
                if isinstance(v, (list, tuple)) and len(v) == 2:
                    start, end = int(v[0]), int(v[1])
                else:
                    start, end = 0, int(v)
                part = int(p)
            except (TypeError, ValueError):
                raise ConfigurationError(
                    f"--expected: {topic!r}[{p!r}] = {v!r} is not an offset or [start, end]"
                ) from None
            if start < 0 or end < start:
                raise ConfigurationError(f"--expected: {topic!r}[{p}] has start {start} > end {end}")
            out[(str(topic), part)] = (start, end)
    return out


# --------------------------------------------------------------------------- pure checks


def runs(sorted_offsets: Iterable[int]) -> list[tuple[int, int]]:
    """Consecutive runs of sorted distinct integers as inclusive ``(first, last)`` pairs."""
    out: list[tuple[int, int]] = []
    for o in sorted_offsets:
        if out and o == out[-1][1] + 1:
            out[-1] = (out[-1][0], o)
        else:
            out.append((o, o))
    return out


@dataclasses.dataclass(frozen=True)
class Segment:
    """The offsets one committed insert stored in one topic-partition."""

    key: str  # the segment column's value, ordered as committed
    first: int
    last: int
    rows: int


def check_segments(topic: str | None, partition: int, segments: Sequence[Segment]) -> list[Anomaly]:
    """eBay's checks between consecutive committed ranges of one topic-partition.

    ``segments`` must be in commit order. Next range ``[a, b]`` after ``[p, q]``:
    ``a == q + 1`` is clean; ``a > q + 1`` a gap; ``b < p`` backward; else overlap.
    A segment holding fewer rows than its range is reported by the table-wide gap check.
    """
    tp: TP = (topic, partition)
    out: list[Anomaly] = []
    for prev, cur in zip(segments, segments[1:]):
        if cur.first == prev.last + 1:
            continue
        if cur.first > prev.last + 1:
            detail = f"insert {cur.key} starts at {cur.first}, after insert {prev.key} ended at {prev.last}"
            out.append(Anomaly.over("gap", tp, prev.last + 1, cur.first - 1, detail))
            continue
        where = f"insert {cur.key} [{cur.first}, {cur.last}]"
        earlier = f"the earlier insert {prev.key} [{prev.first}, {prev.last}]"
        if cur.last < prev.first:
            out.append(
                Anomaly.over("backward", tp, cur.first, cur.last, f"{where} lies before {earlier}", count=cur.rows)
            )
        else:
            lo, hi = max(cur.first, prev.first), min(cur.last, prev.last)
            out.append(Anomaly.over("overlap", tp, lo, hi, f"{where} overlaps {earlier}", count=max(0, hi - lo + 1)))
    return out


def tp_order(tp: TP) -> tuple[str, int]:
    """The order of topic-partitions in a report (a missing topic sorts as ``"None"``)."""
    return (str(tp[0]), tp[1])


def check_expected(summaries: Mapping[TP, PartitionSummary], expected: Mapping[TP, tuple[int, int]]) -> list[Anomaly]:
    """Head/tail gaps, missing partitions and offsets past the expected end."""
    out: list[Anomaly] = []
    for tp, (start, end) in sorted(expected.items(), key=lambda kv: tp_order(kv[0])):
        s = summaries.get(tp)
        if s is None:
            if end > start:
                out.append(Anomaly.over("gap", tp, start, end - 1, "partition has no rows at all"))
            continue
        if s.min_offset > start:
            head = f"head missing: first stored offset is {s.min_offset}, expected {start}"
            out.append(Anomaly.over("gap", tp, start, s.min_offset - 1, head))
        if s.max_offset < end - 1:
            tail = f"tail missing: last stored offset is {s.max_offset}, expected {end - 1}"
            out.append(Anomaly.over("gap", tp, s.max_offset + 1, end - 1, tail))
        if s.min_offset < start:
            below = f"offsets below the expected start {start}"
            out.append(Anomaly.over("unexpected", tp, s.min_offset, start - 1, below))
        if s.max_offset >= end:
            past = f"offsets at or past the expected end {end}"
            out.append(Anomaly.over("unexpected", tp, end, s.max_offset, past))
    for tp, s in sorted(summaries.items(), key=lambda kv: tp_order(kv[0])):
        if expected and tp not in expected:
            stray = "partition not in the expected offsets"
            out.append(Anomaly.over("unexpected", tp, s.min_offset, s.max_offset, stray, count=s.rows))
    return out


# --------------------------------------------------------------------------- reading the table


@dataclasses.dataclass(frozen=True)
class Columns:
    """Where the Kafka coordinates are stored (``topic`` None: a table without one)."""

    topic: str | None
    partition: str
    offset: str

    def key_sql(self) -> str:
        t = quote_ident(self.topic) if self.topic else "''"
        return f"{t} AS topic, {quote_ident(self.partition)} AS partition, {quote_ident(self.offset)} AS offset"

    def tp(self, r: Mapping[str, Any]) -> TP:
        """The topic-partition of a row read with :meth:`key_sql`'s names."""
        return (r["topic"] if self.topic else None, int(r["partition"]))


@dataclasses.dataclass(frozen=True)
class Scan:
    """What every query of one :func:`~clickhouse_tx.verify.verifier.verify` call reads: the client,
    columns, source, limit."""

    ch: ClickHouseReader
    cols: Columns
    src: str  # the quoted db.table
    limit: int  # rows fetched per kind of anomaly (counts stay exact)

    def key_source(self, distinct: bool = False, extra: str = "") -> str:
        """``(SELECT topic, partition, offset[, extra] FROM src)`` for a FROM clause."""
        return f"(SELECT {'DISTINCT ' if distinct else ''}{self.cols.key_sql()}{extra} FROM {self.src})"


def summaries(scan: Scan, expected: Mapping[TP, tuple[int, int]]) -> dict[TP, PartitionSummary]:
    """Rows, distinct offsets and the offset range per topic-partition (one query)."""
    parts = scan.ch.rows(
        f"SELECT topic, partition, count() AS rows, uniqExact(offset) AS distinct, "
        f"min(offset) AS lo, max(offset) AS hi FROM {scan.key_source()} "
        f"GROUP BY topic, partition ORDER BY topic, partition"
    )
    out: dict[TP, PartitionSummary] = {}
    for r in parts:
        tp = scan.cols.tp(r)
        start, end = expected.get(tp, (None, None))
        out[tp] = PartitionSummary(
            tp[0], tp[1], int(r["rows"]), int(r["distinct"]), int(r["lo"]), int(r["hi"]), start, end
        )
    return out


def offset_checks(
    scan: Scan,
    found: Mapping[TP, PartitionSummary],
    expected: Mapping[TP, tuple[int, int]] | None,
    segment_col: str | None,
) -> tuple[list[str], list[Anomaly]]:
    """The checks of the stored offsets (duplicates, gaps, expected, segments): their names and findings."""
    checks = ["duplicates", "gaps"]
    anomalies = _duplicates(scan, found) + _gaps(scan, found)
    if expected:
        checks.append("expected offsets")
        anomalies.extend(check_expected(found, expected))
    if segment_col:
        checks.append(f"segments by {segment_col}")
        anomalies.extend(_segment_anomalies(scan, segment_col))
    return checks, anomalies


def _duplicates(scan: Scan, found: Mapping[TP, PartitionSummary]) -> list[Anomaly]:
    """Duplicated offsets: exact counts per partition, ranges from a bounded sample."""
    if all(s.rows == s.distinct for s in found.values()):
        return []
    dups = scan.ch.rows(
        f"SELECT topic, partition, offset, count() AS c FROM {scan.key_source()} "
        f"GROUP BY topic, partition, offset HAVING c > 1 "
        f"ORDER BY topic, partition, offset LIMIT {scan.limit}"
    )
    by_tp: dict[TP, list[tuple[int, int]]] = {}
    for r in dups:
        by_tp.setdefault(scan.cols.tp(r), []).append((int(r["offset"]), int(r["c"])))
    out: list[Anomaly] = []
    for tp, s in found.items():
        if s.rows != s.distinct:
            out.extend(_duplicate_runs(tp, s.rows - s.distinct, by_tp.get(tp, [])))
    return out


def _duplicate_runs(tp: TP, extra: int, sample: list[tuple[int, int]]) -> list[Anomaly]:
    """One anomaly per run of consecutive duplicated offsets of ``sample`` (offset, copies)."""
    copies = dict(sample)
    rs = runs(o for o, _ in sample)
    if not rs:
        return [Anomaly.in_partition("duplicate", tp, extra, f"{extra} duplicate rows (beyond the sample limit)")]
    out: list[Anomaly] = []
    shown = 0
    for a, b in rs:
        n = sum(copies[o] - 1 for o in range(a, b + 1))
        shown += n
        most = max(copies[o] for o in range(a, b + 1))
        detail = f"{b - a + 1} offsets stored {most}x" if b > a else f"offset stored {copies[a]}x"
        out.append(Anomaly.over("duplicate", tp, a, b, detail, count=n))
    if shown < extra:
        out.append(Anomaly.in_partition("duplicate", tp, extra - shown, "more duplicate rows beyond the sample limit"))
    return out


def _gaps(scan: Scan, found: Mapping[TP, PartitionSummary]) -> list[Anomaly]:
    """Offsets missing between stored ones (exact counts, ranges from a bounded sample)."""
    holes = {tp: s.max_offset - s.min_offset + 1 - s.distinct for tp, s in found.items()}
    if not any(holes.values()):
        return []
    gaps = scan.ch.rows(
        f"SELECT topic, partition, prev + 1 AS first, offset - 1 AS last FROM ("
        f"SELECT topic, partition, offset, "
        f"lagInFrame(offset) OVER (PARTITION BY topic, partition ORDER BY offset "
        f"ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS prev, "
        f"row_number() OVER (PARTITION BY topic, partition ORDER BY offset) AS rn "
        f"FROM {scan.key_source(distinct=True)}) WHERE rn > 1 AND offset - prev > 1 "
        f"ORDER BY topic, partition, first LIMIT {scan.limit}"
    )
    out: list[Anomaly] = []
    shown_by: dict[TP, int] = {}
    for r in gaps:
        tp = scan.cols.tp(r)
        a = Anomaly.over("gap", tp, int(r["first"]), int(r["last"]), "offsets missing between stored ones")
        shown_by[tp] = shown_by.get(tp, 0) + a.count
        out.append(a)
    for tp, n in holes.items():
        if n > shown_by.get(tp, 0):
            more = "more missing offsets beyond the sample limit"
            out.append(Anomaly.in_partition("gap", tp, n - shown_by.get(tp, 0), more))
    return out


def _segment_anomalies(scan: Scan, segment_col: str) -> list[Anomaly]:
    """Overlapping or backward inserts (:func:`check_segments`); gaps are the table's."""
    seg = scan.ch.rows(
        f"SELECT topic, partition, toString(seg) AS seg, min(offset) AS first, max(offset) AS last, "
        f"count() AS rows FROM {scan.key_source(extra=f', {quote_ident(segment_col)} AS seg')} "
        f"GROUP BY topic, partition, seg ORDER BY topic, partition, seg, first "
        f"LIMIT {scan.limit}"
    )
    grouped: dict[TP, list[Segment]] = {}
    for r in seg:
        grouped.setdefault(scan.cols.tp(r), []).append(
            Segment(r["seg"], int(r["first"]), int(r["last"]), int(r["rows"]))
        )
    out: list[Anomaly] = []
    for tp, segs in sorted(grouped.items(), key=lambda kv: tp_order(kv[0])):
        # a gap between inserts is already a table gap; keep overlap/backward only
        out.extend(a for a in check_segments(tp[0], tp[1], segs) if a.kind != "gap")
    return out
