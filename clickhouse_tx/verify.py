"""An exactly-once verifier for any ClickHouse table fed from Kafka (eBay's "runtime verifier").

It reads the target table (and, when present, the commit markers and the decision
logs) and reports, per topic-partition:

- ``duplicate``: an offset stored more than once (runs of consecutive duplicated
  offsets are reported as one range: a replayed batch committed twice looks like that);
- ``gap``: offsets missing inside what was stored, or, against ``expected`` end
  offsets, at its head or tail, or whole partitions missing;
- ``unexpected``: offsets or partitions beyond the expected ones;
- with ``segment_col`` (a column constant per insert, e.g. ``ingested_at
  DateTime64(3) DEFAULT now64(3)``, or a batch id): the offset range of each
  committed insert, in order, checked like eBay's verifier: the next range must start
  right after the previous one (``gap`` if later, ``overlap`` if it starts inside the
  previous range, ``backward`` if it lies wholly before it);
- with the markers table ``clickhouse_tx_commits`` in the target database:
  ``double_commit`` (one (txn_id, batch, partition) committed under two xids) and
  ``marker_count_mismatch`` (marker rows' ``rows`` do not add up to the table's row count);
- with a checkpoint location (the decision logs): ``decided_not_committed``, a batch
  whose decision names an xid whose marker is not visible.

The table's materialized views (:func:`clickhouse_tx.views.dependent_views`, down
chains) are listed in the report as not checked, each with why: a view's table holds
what its ``SELECT`` made of each inserted block (a rollup, a filter), which the
verifier cannot recompute from the offsets; ``docs/modes.md`` says what each mode
keeps of them. The verdict (``clean``) is the table's.

Every read of user tables uses ``implicit_transaction=1``: ClickHouse shows the rows of
running (uncommitted) transactions to queries outside a transaction (``docs/design.md`` §4), so a
plain ``SELECT`` would count rows that may still be rolled back. ``system.*`` tables do
not support transactions and are read without it.

Everything here runs in the calling process (a CLI, a benchmark, a test); no Spark.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Iterable, Mapping, Sequence

from clickhouse_tx._transport import ClickHouseHTTP, safe_url
from clickhouse_tx.errors import ClickHouseTxError, ConfigurationError
from clickhouse_tx.interfaces import Target
from clickhouse_tx.markers import CommittedReader
from clickhouse_tx.sql import quote_option_identifier as quote_ident  # names come from the CLI
from clickhouse_tx.sql import split_table

MARKERS_TABLE = "clickhouse_tx_commits"
#: At most this many rows of a kind are fetched to describe anomalies (counts stay exact).
DEFAULT_SAMPLE_LIMIT = 100_000

TP = tuple[str | None, int]


# --------------------------------------------------------------------------- reading


class ClickHouseReader:
    """Read-only access for the verifier: JSON rows, query parameters, read-committed reads.

    A thin layer on the project's one client (:class:`clickhouse_tx._transport.ClickHouseHTTP`):
    the same authentication, parameter formatting and error mapping as the writer.
    The password is sent as a header and never appears in ``repr`` or errors.
    """

    def __init__(self, url: str, *, user: str = "default", password: str = "", timeout_s: float = 300.0) -> None:
        self.url = safe_url(url.rstrip("/"))
        self.user = user
        self._client = ClickHouseHTTP(
            Target(url=url, database="", table="", user=user, password=password, request_timeout_s=timeout_s)
        )
        self._committed = CommittedReader(self._client)

    def __repr__(self) -> str:
        return f"ClickHouseReader(url={self.url!r}, user={self.user!r})"

    def close(self) -> None:
        self._client.close()

    def rows(
        self, sql: str, params: Mapping[str, object] | None = None, *, committed: bool = True
    ) -> list[dict[str, Any]]:
        """Run a SELECT and return its rows as dicts (64-bit integers as ints).

        ``committed`` reads with ``implicit_transaction=1`` (only MergeTree-family
        tables; ``system.*`` needs ``committed=False``). Where the server refuses
        transactions none can be open, so the plain read is committed (remembered).
        """
        if committed:
            return self._committed.query_json(sql, params)
        return self._client.query_json(sql, params=params)

    def columns(self, database: str, table: str) -> dict[str, str]:
        """Column name → type of ``database.table`` (empty if the table does not exist)."""
        out = self.rows(
            "SELECT name, type FROM system.columns WHERE database = {d:String} "
            "AND table = {t:String} ORDER BY position",
            {"d": database, "t": table},
            committed=False,
        )
        return {r["name"]: r["type"] for r in out}


# --------------------------------------------------------------------------- the report


@dataclasses.dataclass(frozen=True)
class Anomaly:
    """One finding. ``first``/``last`` bound the offsets concerned (inclusive), when known."""

    kind: str
    topic: str | None
    partition: int | None
    first: int | None
    last: int | None
    count: int
    detail: str

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
    out: list[Anomaly] = []
    for prev, cur in zip(segments, segments[1:]):
        if cur.first == prev.last + 1:
            continue
        if cur.first > prev.last + 1:
            out.append(
                Anomaly(
                    "gap",
                    topic,
                    partition,
                    prev.last + 1,
                    cur.first - 1,
                    cur.first - prev.last - 1,
                    f"insert {cur.key} starts at {cur.first}, after insert {prev.key} ended at {prev.last}",
                )
            )
        elif cur.last < prev.first:
            out.append(
                Anomaly(
                    "backward",
                    topic,
                    partition,
                    cur.first,
                    cur.last,
                    cur.rows,
                    f"insert {cur.key} [{cur.first}, {cur.last}] lies before the earlier "
                    f"insert {prev.key} [{prev.first}, {prev.last}]",
                )
            )
        else:
            lo, hi = max(cur.first, prev.first), min(cur.last, prev.last)
            out.append(
                Anomaly(
                    "overlap",
                    topic,
                    partition,
                    lo,
                    hi,
                    max(0, hi - lo + 1),
                    f"insert {cur.key} [{cur.first}, {cur.last}] overlaps the earlier "
                    f"insert {prev.key} [{prev.first}, {prev.last}]",
                )
            )
    return out


def _span(kind: str, tp: TP, first: int, last: int, detail: str) -> Anomaly:
    """An anomaly over the offsets ``first..last`` (inclusive) of ``tp``, all of them concerned."""
    return Anomaly(kind, tp[0], tp[1], first, last, last - first + 1, detail)


def check_expected(summaries: Mapping[TP, PartitionSummary], expected: Mapping[TP, tuple[int, int]]) -> list[Anomaly]:
    """Head/tail gaps, missing partitions and offsets past the expected end."""
    out: list[Anomaly] = []
    for tp, (start, end) in sorted(expected.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        s = summaries.get(tp)
        if s is None:
            if end > start:
                out.append(_span("gap", tp, start, end - 1, "partition has no rows at all"))
            continue
        if s.min_offset > start:
            head = f"head missing: first stored offset is {s.min_offset}, expected {start}"
            out.append(_span("gap", tp, start, s.min_offset - 1, head))
        if s.max_offset < end - 1:
            tail = f"tail missing: last stored offset is {s.max_offset}, expected {end - 1}"
            out.append(_span("gap", tp, s.max_offset + 1, end - 1, tail))
        if s.min_offset < start:
            out.append(_span("unexpected", tp, s.min_offset, start - 1, f"offsets below the expected start {start}"))
        if s.max_offset >= end:
            out.append(_span("unexpected", tp, end, s.max_offset, f"offsets at or past the expected end {end}"))
    for tp, s in sorted(summaries.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        if expected and tp not in expected:
            stray = "partition not in the expected offsets"
            out.append(Anomaly("unexpected", tp[0], tp[1], s.min_offset, s.max_offset, s.rows, stray))
    return out


# --------------------------------------------------------------------------- verify


@dataclasses.dataclass(frozen=True)
class _Cols:
    topic: str | None
    partition: str
    offset: str

    def key_sql(self) -> str:
        t = quote_ident(self.topic) if self.topic else "''"
        return f"{t} AS topic, {quote_ident(self.partition)} AS partition, {quote_ident(self.offset)} AS offset"


def _tp(cols: _Cols, r: Mapping[str, Any]) -> TP:
    return (r["topic"] if cols.topic else None, int(r["partition"]))


def verify(
    url: str,
    table: str,
    *,
    topic_col: str | None = "topic",
    partition_col: str = "partition",
    offset_col: str = "offset",
    expected: Mapping[TP, tuple[int, int]] | None = None,
    segment_col: str | None = None,
    txn_id: str | None = None,
    checkpoint: str | None = None,
    markers: bool | None = None,
    user: str = "default",
    password: str = "",
    sample_limit: int = DEFAULT_SAMPLE_LIMIT,
) -> VerifyReport:
    """Check ``table`` for exactly-once anomalies (see the module docstring).

    Parameters
    ----------
    url, table:
        The ClickHouse HTTP endpoint and ``db.table`` to check.
    topic_col, partition_col, offset_col:
        Where the Kafka coordinates are stored; ``topic_col=None`` for tables without one.
    expected:
        From :func:`parse_expected`: the offsets that must be present, exactly once.
    segment_col:
        A column constant within one committed insert (see the module docstring).
    txn_id:
        Restrict marker and decision checks to this query's transactional id.
    checkpoint:
        The query's ``checkpointLocation``: check its decision logs against the markers.
    markers:
        Check the markers table: None = when it exists, True = it must exist.

    Raises
    ------
    ConfigurationError
        The table or a named column does not exist.
    ServerError
        ClickHouse refused a query or could not be reached.
    """
    db, t = split_table(table)
    ch = ClickHouseReader(url, user=user, password=password)
    try:
        scan = _open_scan(
            ch, db, t, url, (topic_col, partition_col, offset_col), segment_col=segment_col, sample_limit=sample_limit
        )
        if expected and not scan.cols.topic:
            # a table without a topic column is checked by partition alone
            expected = {(None, p): v for (_, p), v in expected.items()}
        summaries = _summaries(scan, expected or {})
        total = sum(s.rows for s in summaries.values())
        checks, anomalies = _offset_checks(scan, summaries, expected, segment_col)
        marker_info = _marker_and_decision_checks(
            ch, db, t, total, txn_id=txn_id, checkpoint=checkpoint, markers=markers, checks=checks, anomalies=anomalies
        )
        return VerifyReport(
            table=table,
            rows=total,
            distinct=sum(s.distinct for s in summaries.values()),
            partitions=tuple(summaries[k] for k in sorted(summaries, key=_tp_order)),
            anomalies=tuple(anomalies),
            checks=tuple(checks),
            markers=marker_info,
            views_not_checked=views_not_checked(Target(url=url, database=db, table=t, user=user, password=password)),
        )
    finally:
        ch.close()


#: Why a materialized view's table is not checked (see the module docstring).
VIEW_NOT_CHECKED = (
    "its table holds what the view's SELECT made of each inserted block, which the offsets "
    "cannot recompute; compare it with that SELECT over the table"
)


def views_not_checked(target: Target) -> tuple[dict[str, str], ...]:
    """The target's materialized views, each with why it is not checked; one entry if listing them failed."""
    from clickhouse_tx.views import dependent_views

    try:
        views = dependent_views(target)
    except ClickHouseTxError as exc:
        return ({"view": "*", "table": "*", "why": f"the views could not be listed: {exc}"},)
    return tuple(
        {
            "view": f"{v.view[0]}.{v.view[1]}",
            "table": f"{v.target[0]}.{v.target[1]}" if v.target else "?",
            "why": VIEW_NOT_CHECKED if v.target else "the server does not say which table it writes into",
        }
        for v in views
    )


def _open_scan(
    ch: ClickHouseReader,
    db: str,
    t: str,
    url: str,
    coordinates: tuple[str | None, str, str],
    *,
    segment_col: str | None,
    sample_limit: int,
) -> _Scan:
    """The scan of ``db.t`` once the table and every named column are found to exist.

    ``coordinates``: the (topic, partition, offset) columns; topic None or "" for none.
    """
    topic_col, partition_col, offset_col = coordinates
    _check_columns(
        ch,
        db,
        t,
        url,
        topic_col=topic_col,
        partition_col=partition_col,
        offset_col=offset_col,
        segment_col=segment_col,
    )
    return _Scan(
        ch,
        _Cols(topic_col or None, partition_col, offset_col),
        f"{quote_ident(db)}.{quote_ident(t)}",
        int(sample_limit),
    )


def _offset_checks(
    scan: _Scan,
    summaries: Mapping[TP, PartitionSummary],
    expected: Mapping[TP, tuple[int, int]] | None,
    segment_col: str | None,
) -> tuple[list[str], list[Anomaly]]:
    """The checks of the stored offsets (duplicates, gaps, expected, segments): their names and findings."""
    checks = ["duplicates", "gaps"]
    anomalies = _duplicates(scan, summaries) + _gaps(scan, summaries)
    if expected:
        checks.append("expected offsets")
        anomalies.extend(check_expected(summaries, expected))
    if segment_col:
        checks.append(f"segments by {segment_col}")
        anomalies.extend(_segment_anomalies(scan, segment_col))
    return checks, anomalies


@dataclasses.dataclass(frozen=True)
class _Scan:
    """What every query of one :func:`verify` call reads: the client, columns, source, limit."""

    ch: ClickHouseReader
    cols: _Cols
    src: str  # the quoted db.table
    limit: int  # rows fetched per kind of anomaly (counts stay exact)

    def key_source(self, distinct: bool = False, extra: str = "") -> str:
        """``(SELECT topic, partition, offset[, extra] FROM src)`` for a FROM clause."""
        return f"(SELECT {'DISTINCT ' if distinct else ''}{self.cols.key_sql()}{extra} FROM {self.src})"


def _tp_order(tp: TP) -> tuple[str, int]:
    return (str(tp[0]), tp[1])


def _check_columns(ch: ClickHouseReader, db: str, t: str, url: str, **named: str | None) -> None:
    """The table and every named column exist (``named``: option -> column or None)."""
    types = ch.columns(db, t)
    if not types:
        raise ConfigurationError(f"table {db}.{t} does not exist on {safe_url(url)}")
    for opt, c in named.items():
        if c and c not in types:
            raise ConfigurationError(
                f"{opt.replace('_col', ' column')} {c!r} is not a column of {db}.{t} (columns: {', '.join(types)})"
            )


def _summaries(scan: _Scan, expected: Mapping[TP, tuple[int, int]]) -> dict[TP, PartitionSummary]:
    """Rows, distinct offsets and the offset range per topic-partition (one query)."""
    parts = scan.ch.rows(
        f"SELECT topic, partition, count() AS rows, uniqExact(offset) AS distinct, "
        f"min(offset) AS lo, max(offset) AS hi FROM {scan.key_source()} "
        f"GROUP BY topic, partition ORDER BY topic, partition"
    )
    summaries: dict[TP, PartitionSummary] = {}
    for r in parts:
        tp = _tp(scan.cols, r)
        se = expected.get(tp)
        summaries[tp] = PartitionSummary(
            tp[0],
            tp[1],
            int(r["rows"]),
            int(r["distinct"]),
            int(r["lo"]),
            int(r["hi"]),
            se[0] if se else None,
            se[1] if se else None,
        )
    return summaries


def _duplicates(scan: _Scan, summaries: Mapping[TP, PartitionSummary]) -> list[Anomaly]:
    """Duplicated offsets: exact counts per partition, ranges from a bounded sample."""
    if all(s.rows == s.distinct for s in summaries.values()):
        return []
    dups = scan.ch.rows(
        f"SELECT topic, partition, offset, count() AS c FROM {scan.key_source()} "
        f"GROUP BY topic, partition, offset HAVING c > 1 "
        f"ORDER BY topic, partition, offset LIMIT {scan.limit}"
    )
    by_tp: dict[TP, list[tuple[int, int]]] = {}
    for r in dups:
        by_tp.setdefault(_tp(scan.cols, r), []).append((int(r["offset"]), int(r["c"])))
    out: list[Anomaly] = []
    for tp, s in summaries.items():
        if s.rows != s.distinct:
            out.extend(_duplicate_runs(tp, s.rows - s.distinct, by_tp.get(tp, [])))
    return out


def _duplicate_runs(tp: TP, extra: int, sample: list[tuple[int, int]]) -> list[Anomaly]:
    """One anomaly per run of consecutive duplicated offsets of ``sample`` (offset, copies)."""
    copies = dict(sample)
    rs = runs(o for o, _ in sample)
    if not rs:
        return [
            Anomaly("duplicate", tp[0], tp[1], None, None, extra, f"{extra} duplicate rows (beyond the sample limit)")
        ]
    out: list[Anomaly] = []
    shown = 0
    for a, b in rs:
        n = sum(copies[o] - 1 for o in range(a, b + 1))
        shown += n
        out.append(
            Anomaly(
                "duplicate",
                tp[0],
                tp[1],
                a,
                b,
                n,
                f"{b - a + 1} offsets stored {max(copies[o] for o in range(a, b + 1))}x"
                if b > a
                else f"offset stored {copies[a]}x",
            )
        )
    if shown < extra:
        out.append(
            Anomaly("duplicate", tp[0], tp[1], None, None, extra - shown, "more duplicate rows beyond the sample limit")
        )
    return out


def _gaps(scan: _Scan, summaries: Mapping[TP, PartitionSummary]) -> list[Anomaly]:
    """Offsets missing between stored ones (exact counts, ranges from a bounded sample)."""
    holes = {tp: s.max_offset - s.min_offset + 1 - s.distinct for tp, s in summaries.items()}
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
        tp = _tp(scan.cols, r)
        n = int(r["last"]) - int(r["first"]) + 1
        shown_by[tp] = shown_by.get(tp, 0) + n
        out.append(
            Anomaly("gap", tp[0], tp[1], int(r["first"]), int(r["last"]), n, "offsets missing between stored ones")
        )
    for tp, n in holes.items():
        if n > shown_by.get(tp, 0):
            out.append(
                Anomaly(
                    "gap",
                    tp[0],
                    tp[1],
                    None,
                    None,
                    n - shown_by.get(tp, 0),
                    "more missing offsets beyond the sample limit",
                )
            )
    return out


def _segment_anomalies(scan: _Scan, segment_col: str) -> list[Anomaly]:
    """Overlapping or backward inserts (:func:`check_segments`); gaps are the table's."""
    seg = scan.ch.rows(
        f"SELECT topic, partition, toString(seg) AS seg, min(offset) AS first, max(offset) AS last, "
        f"count() AS rows FROM {scan.key_source(extra=f', {quote_ident(segment_col)} AS seg')} "
        f"GROUP BY topic, partition, seg ORDER BY topic, partition, seg, first "
        f"LIMIT {scan.limit}"
    )
    grouped: dict[TP, list[Segment]] = {}
    for r in seg:
        grouped.setdefault(_tp(scan.cols, r), []).append(
            Segment(r["seg"], int(r["first"]), int(r["last"]), int(r["rows"]))
        )
    out: list[Anomaly] = []
    for tp, segs in sorted(grouped.items(), key=lambda kv: _tp_order(kv[0])):
        # a gap between inserts is already a table gap; keep overlap/backward only
        out.extend(a for a in check_segments(tp[0], tp[1], segs) if a.kind != "gap")
    return out


def _marker_and_decision_checks(
    ch: ClickHouseReader,
    db: str,
    t: str,
    total: int,
    *,
    txn_id: str | None,
    checkpoint: str | None,
    markers: bool | None,
    checks: list[str],
    anomalies: list[Anomaly],
) -> dict[str, object] | None:
    """The markers table and the decision logs, when present or asked for.

    Appends to ``checks`` and ``anomalies``; returns the markers' totals (None: not checked).
    """
    mtypes = ch.columns(db, MARKERS_TABLE)
    if markers and not mtypes:
        raise ConfigurationError(f"the markers table {db}.{MARKERS_TABLE} does not exist")
    if not mtypes or markers is False:
        if checkpoint:
            raise ConfigurationError(
                f"checking the decision logs of {checkpoint} needs the markers "
                f"table {db}.{MARKERS_TABLE}, which does not exist"
            )
        return None
    checks.append("markers")
    marker_info, found = _check_markers(ch, db, t, mtypes, total, txn_id)
    anomalies.extend(found)
    if checkpoint:
        checks.append("decision logs")
        anomalies.extend(_check_decisions(ch, db, mtypes, checkpoint, txn_id))
    return marker_info


def _marker_filter(db: str, t: str, mtypes: Mapping[str, str], txn_id: str | None) -> tuple[str, dict[str, object]]:
    conds: list[str] = []
    params: dict[str, object] = {}
    if "table" in mtypes:
        # markers name the target as "db.table" or as the bare table
        conds.append("(`table` = {mt_full:String} OR `table` = {mt_bare:String})")
        params.update(mt_full=f"{db}.{t}", mt_bare=t)
    if txn_id:
        conds.append("txn_id = {mt_txn:String}")
        params["mt_txn"] = txn_id
    return (" WHERE " + " AND ".join(conds)) if conds else "", params


def _check_markers(
    ch: ClickHouseReader, db: str, t: str, mtypes: Mapping[str, str], table_rows: int, txn_id: str | None
) -> tuple[dict[str, object], list[Anomaly]]:
    src = f"{quote_ident(db)}.{quote_ident(MARKERS_TABLE)}"
    where, params = _marker_filter(db, t, mtypes, txn_id)
    out: list[Anomaly] = []
    agg = ch.rows(
        f"SELECT count() AS markers, sum(`rows`) AS rows, uniqExact(txn_id) AS txns FROM {src}{where}", params
    )[0]
    jobs, job_rows = _published_jobs(ch, db, t, txn_id)
    info: dict[str, object] = {
        "markers": int(agg["markers"]),
        "rows": int(agg["rows"] or 0),
        "txn_ids": int(agg["txns"]),
        "published_jobs": jobs,
        "published_job_rows": job_rows,
    }
    doubles = ch.rows(
        f"SELECT txn_id, batch, `partition` AS p, groupArray(xid) AS xids FROM {src}{where} "
        f"GROUP BY txn_id, batch, p HAVING count() > 1 ORDER BY txn_id, batch, p LIMIT 1000",
        params,
    )
    for r in doubles:
        out.append(
            Anomaly(
                "double_commit",
                None,
                None,
                None,
                None,
                len(r["xids"]) - 1,
                f"txn {r['txn_id']} batch {r['batch']} spark partition {r['p']} committed "
                f"by {len(r['xids'])} xids: {', '.join(r['xids'])}",
            )
        )
    # Only a table filled by this one query can be compared with its markers' row counts.
    # A batch job published at once has markers for its stage and one row for the target.
    accounted = int(agg["rows"] or 0) + job_rows
    if (int(agg["markers"]) or jobs) and accounted != table_rows and (txn_id is None or int(agg["txns"]) + jobs == 1):
        out.append(
            Anomaly(
                "marker_count_mismatch",
                None,
                None,
                None,
                None,
                abs(accounted - table_rows),
                f"markers and published jobs account for {accounted} rows, the table holds {table_rows}",
            )
        )
    return info, out


def _published_jobs(ch: ClickHouseReader, db: str, t: str, txn_id: str | None) -> tuple[int, int]:
    """(jobs, rows) of the batch jobs published into ``db.t`` at once (``clickhouse_tx_jobs``)."""
    from clickhouse_tx.job_publish import JOBS_TABLE

    if not ch.columns(db, JOBS_TABLE):
        return 0, 0
    where = "`table` = {jt:String}" + (" AND txn_id = {jx:String}" if txn_id else "")
    row = ch.rows(
        f"SELECT count() AS jobs, sum(`rows`) AS rows FROM {quote_ident(db)}.{quote_ident(JOBS_TABLE)} WHERE {where}",
        {"jt": f"{db}.{t}", "jx": txn_id or ""},
    )[0]
    return int(row["jobs"]), int(row["rows"] or 0)


def _check_decisions(
    ch: ClickHouseReader, db: str, mtypes: Mapping[str, str], checkpoint: str, txn_id: str | None
) -> list[Anomaly]:
    """Every xid a decision log names must have a visible marker (every mode but none)."""
    from clickhouse_tx.decision_log import FileDecisionLog, txn_ids_with_decisions

    txns = [txn_id] if txn_id else txn_ids_with_decisions(checkpoint)
    src = f"{quote_ident(db)}.{quote_ident(MARKERS_TABLE)}"
    out: list[Anomaly] = []
    for txn in txns:
        lg = FileDecisionLog(checkpoint, txn)
        seen = {r["xid"] for r in ch.rows(f"SELECT xid FROM {src} WHERE txn_id = {{tx:String}}", {"tx": txn})}
        for b in sorted(lg.batches()):
            d = lg.read(b)
            if d is None:
                continue
            missing = [p for p in d.chosen if p.xid not in seen and p.mode.value != "none"]
            if missing:
                state = "marked done" if d.done else "not marked done (a replay would roll it forward)"
                out.append(
                    Anomaly(
                        "decided_not_committed",
                        None,
                        None,
                        None,
                        None,
                        len(missing),
                        f"txn {txn} batch {b} (decision v{d.version}, {state}): no marker for "
                        + ", ".join(f"partition {p.partition} xid {p.xid}" for p in missing),
                    )
                )
    return out
