"""Mode ``dedup``: the deduplication window a replay relies on, read and checked (before
each chunk in one statement with the attempt's fence).

ClickHouse remembers the tokens of a table's most recent blocks: one block, and one
entry of the window, for every part an INSERT writes (one per table partition its
block touches). A partition's chunks are deduplicated on replay only while its first
chunk's token is still remembered, so the executor (before each chunk) and the driver
(before the marker) check that fewer blocks went into the table since that first chunk
than the window holds, for the target and for every table its materialized views write
into. What is counted depends on the engine:

``MergeTree``
    ``non_replicated_deduplication_window`` keeps the last N block hashes of the table
    (``MergeTreeDeduplicationLog``), and the table has one block-number counter, so the
    blocks since a point are the difference of ``max(max_block_number)`` of
    ``system.parts`` (:attr:`BlockPoint.top`). No age bound.
``Replicated*MergeTree``, ``SharedMergeTree``
    Block numbers are allocated per partition (``<zookeeper_path>/block_numbers/<partition
    id>/block-N``, ``StorageReplicatedMergeTree::allocateBlockNumber``: part names
    ``<partition_id>_<min>_<max>_<level>``), while ``replicated_deduplication_window``
    keeps the N newest block hashes of the whole table (``<zookeeper_path>/blocks``,
    trimmed by ``ReplicatedMergeTreeCleanupThread::clearOldBlocks``). So a point records
    each partition's highest block number, and the blocks since it are the sum over
    partitions of the numbers allocated since (:func:`blocks_since`). ``clearOldBlocks``
    also drops every hash older than ``replicated_deduplication_window_seconds`` than the
    newest one (3600 s by default since ClickHouse 25.10, 604800 s before): a point records
    the server's clock too, and once that much time may have passed since it the check
    refuses as it does for a full window (:func:`window_problem`).

Both counts are upper bounds where ClickHouse numbers more than it remembers (mutations
and ``ALTER`` statements take block numbers, a failed insert may leave one unused) and lower
bounds only where this server cannot see: blocks inserted through another replica that
this one has not fetched yet, and parts of a partition dropped since the point.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.conversion.schema import describe_table
from clickhouse_tx.errors import DedupWindowError, NotCommittedError
from clickhouse_tx.interfaces import Target
from clickhouse_tx.modes.views import dependent_views, view_tables
from clickhouse_tx.protocol.state import TxState

if TYPE_CHECKING:  # pragma: no cover
    from clickhouse_tx.store.registry import KeeperMapRegistry

#: Share of ``replicated_deduplication_window_seconds`` a point is trusted for. The age
#: that counts is measured by Keeper's clock between two block hashes; the check measures
#: it by the server's clock between two reads, and either clock may be stepped (NTP) in
#: between.
AGE_TRUSTED = 0.9


@dataclasses.dataclass(frozen=True)
class BlockPoint:
    """Where a table's block numbers stood at one read (executor, before a chunk; driver,
    at the commit).

    ``top`` is the table's highest block number; ``partitions`` (Replicated and Shared
    tables only, else None) the highest per partition id; ``at_ms`` the server's clock
    (None when not read: a message of an earlier version).
    """

    top: int
    partitions: Mapping[str, int] | None = None
    at_ms: int | None = None

    def to_details(self) -> int | dict[str, Any]:
        """The JSON form kept in ``Prepared.details``: a plain number for a non-replicated
        table, as earlier versions wrote it."""
        if self.partitions is None:
            return self.top
        return {"top": self.top, "partitions": dict(self.partitions), "at_ms": self.at_ms}

    @classmethod
    def from_details(cls, value: object) -> "BlockPoint":
        """The point :meth:`to_details` wrote (or an earlier version's number)."""
        if isinstance(value, Mapping):
            parts = value.get("partitions")
            at = value.get("at_ms")
            return cls(
                int(value["top"]),
                None if parts is None else {str(k): int(v) for k, v in dict(parts).items()},
                None if at is None else int(at),
            )
        return cls(int(str(value)))


def earliest(points: Iterable[BlockPoint]) -> BlockPoint:
    """A point no later than any of ``points`` (driver: the oldest first chunk of a batch).

    Per partition the lowest number, and a partition missing from one point counts as
    not yet numbered there; the earliest clock reading.
    """
    pts = list(points)
    parts: dict[str, int] | None = None
    if all(p.partitions is not None for p in pts):
        maps = [dict(p.partitions or {}) for p in pts]
        common = set(maps[0]).intersection(*maps[1:]) if maps else set()
        parts = {k: min(m[k] for m in maps) for k in common}
    clocks = [p.at_ms for p in pts if p.at_ms is not None]
    return BlockPoint(min(p.top for p in pts), parts, min(clocks) if clocks else None)


def blocks_since(then: Mapping[str, int], now: Mapping[str, int]) -> int:
    """Block numbers a Replicated table allocated between two readings of its partitions'
    highest block numbers: the sum over partitions of the difference.

    Each partition numbers its blocks from 0 on its own, so a partition missing from
    ``then`` counts every number up to its highest; one missing from ``now`` (dropped
    since) counts nothing, and a partition's number never counts backwards.
    """
    return sum(max(0, top - then.get(pid, -1)) for pid, top in now.items())


def count_since(then: BlockPoint, now: BlockPoint) -> int:
    """Blocks inserted between two points of one table: per partition when both points
    have them (Replicated and Shared tables), else by the table's single counter."""
    if then.partitions is not None and now.partitions is not None:
        return blocks_since(then.partitions, now.partitions)
    return now.top - then.top


@dataclasses.dataclass(frozen=True)
class WindowSettings:
    """A table's deduplication window: engine kind, blocks kept, seconds kept (Replicated)."""

    replicated: bool
    blocks: int
    seconds: int | None = None

    @property
    def blocks_setting(self) -> str:
        return f"{'' if self.replicated else 'non_'}replicated_deduplication_window"


def window_problem(then: BlockPoint, now: BlockPoint, window: WindowSettings, target: Target) -> str | None:
    """Why the tokens written at ``then`` may have left ``target``'s window by ``now``, or None.

    Pure; :func:`check_window` raises with it.
    """
    table, fq = f"{target.database}.{target.table}", q.qualified(target.database, target.table)
    since = count_since(then, now)
    if since >= window.blocks:
        return (
            f"{since} parts were inserted into {table} since this partition's first chunk, and "
            f"its dedup window holds {window.blocks}: the tokens of its first chunks may have left "
            f"the window, so a replay could duplicate rows. Raise it (ALTER TABLE {fq} MODIFY SETTING "
            f"{window.blocks_setting} = {max(1000, 4 * since)}) or write smaller batches"
        )
    if window.replicated and window.seconds is not None and then.at_ms is not None and now.at_ms is not None:
        elapsed = (now.at_ms - then.at_ms) / 1000
        if elapsed >= AGE_TRUSTED * window.seconds:
            return (
                f"{elapsed:.0f} s passed since this partition's first chunk, and {table} keeps block "
                f"hashes for replicated_deduplication_window_seconds = {window.seconds} (counted from "
                "its newest insert): the tokens of its first chunks may have expired, so a replay could "
                f"duplicate rows. Raise it (ALTER TABLE {fq} MODIFY SETTING "
                f"replicated_deduplication_window_seconds = {max(3600, 4 * int(elapsed))}) or commit sooner"
            )
    return None


def check_window(then: BlockPoint, now: BlockPoint, window: WindowSettings, target: Target, xid: str) -> None:
    """Raise :class:`DedupWindowError` if the blocks since ``then`` fill ``window``, or its
    age bound may have passed (:func:`window_problem`)."""
    problem = window_problem(then, now, window, target)
    if problem is not None:
        raise DedupWindowError(problem, xid=xid)


# ---------------------------------------------------------------------- the reads


def _point_columns(target: Target, i: int) -> str:
    """Columns ``b<i>`` (partition id -> highest block number) and ``e<i>`` (engine) of
    one point's read, scalar subqueries of one ``SELECT``."""
    where = f"database = {q.quote_string(target.database)} AND table = {q.quote_string(target.table)}"
    named = f"database = {q.quote_string(target.database)} AND name = {q.quote_string(target.table)}"
    return (
        f"(SELECT maxMap(map(partition_id, max_block_number)) FROM system.parts WHERE {where}) AS b{i}, "
        f"(SELECT any(engine) FROM system.tables WHERE {named}) AS e{i}"
    )


#: The server's clock, column ``t`` of a points read.
_CLOCK = "toUnixTimestamp64Milli(now64(3)) AS t"


def _point(row: Mapping[str, Any], i: int) -> BlockPoint:
    """The point ``i`` of a row read with :func:`_point_columns` and :data:`_CLOCK`."""
    parts = {str(k): int(v) for k, v in dict(row[f"b{i}"] or {}).items()}
    top = max(parts.values(), default=0)
    if not str(row[f"e{i}"] or "").startswith(("Replicated", "Shared")):
        return BlockPoint(top)
    return BlockPoint(top, parts, int(row["t"]))


def read_points(client: ClickHouseHTTP, tables: Sequence[Target]) -> list[BlockPoint]:
    """Each of ``tables``' :class:`BlockPoint` now, in one ``SELECT``."""
    cols = "".join(f"{_point_columns(t, i)}, " for i, t in enumerate(tables))
    row = client.query_json(f"SELECT {cols}{_CLOCK}")[0]
    return [_point(row, i) for i in range(len(tables))]


def max_block_number(client: ClickHouseHTTP, target: Target) -> int:
    """The table's highest block number (:attr:`BlockPoint.top`)."""
    return read_points(client, [target])[0].top


def fence_and_blocks(
    client: ClickHouseHTTP, registry: "KeeperMapRegistry", xid: str, tables: Sequence[Target]
) -> list[BlockPoint]:
    """Executor, before each chunk: refuse to insert once ``xid`` left INITIALIZED (fenced
    by the driver or GC); else the :class:`BlockPoint` of each of ``tables``.

    One statement when the registry is on the server of ``client`` (the xid registered
    before its prepare, so its table is there): the server runs the two reads one after
    the other as two requests would, but the request's own cost is paid once
    (``python -m benchmarks.merged_reads``). Else the registry's read, then the points'.
    """
    if registry.target.url == client.target.url:
        fq = q.qualified(registry.database, registry.table)
        cols = "".join(f", {_point_columns(t, i)}" for i, t in enumerate(tables))
        row = client.query_json(
            f"SELECT (SELECT state FROM {fq} WHERE xid = {q.quote_string(xid)} LIMIT 1) AS s{cols}, {_CLOCK}"
        )[0]
        state, found = row["s"], [_point(row, i) for i in range(len(tables))]
    else:
        entry = registry.get(xid)
        state, found = (None if entry is None else entry.state), read_points(client, tables)
    if state != TxState.INITIALIZED.value:
        raise NotCommittedError(
            f"dedup insert refused: the registry says this attempt is {state or 'not registered'}, so it "
            "was fenced (a newer attempt or the driver's abort replaced it)",
            xid=xid,
        )
    return found


#: (url, database, table) -> (window, monotonic time read). Spark reuses Python
#: workers, so most prepares skip the queries of describe_table.
_WINDOWS: dict[tuple[str, str, str], tuple[WindowSettings, float]] = {}
#: How long a window read stays good: an ALTER of the window is seen within this.
WINDOW_CACHE_S = 30.0
_SECONDS_RE = re.compile(r"\breplicated_deduplication_window_seconds\s*=\s*(\d+)")


def dedup_window(client: ClickHouseHTTP, target: Target, *, fresh: bool = False) -> WindowSettings:
    """The table's dedup window (replicated or not); read at most once per ``WINDOW_CACHE_S``."""
    key = (target.url, target.database, target.table)
    hit = _WINDOWS.get(key)
    if hit is not None and not fresh and time.monotonic() - hit[1] < WINDOW_CACHE_S:
        return hit[0]
    info = describe_table(client, target.database, target.table)
    if info.is_replicated:
        window = WindowSettings(True, info.replicated_dedup_window, _window_seconds(client, info.create_query))
    else:
        window = WindowSettings(False, info.non_replicated_dedup_window)
    _WINDOWS[key] = (window, time.monotonic())
    return window


def _window_seconds(client: ClickHouseHTTP, ddl: str) -> int:
    """``replicated_deduplication_window_seconds`` of a table: its own, else the server's default."""
    m = _SECONDS_RE.search(ddl)
    if m:
        return int(m.group(1))
    rows = client.query_json(
        "SELECT value FROM system.merge_tree_settings WHERE name = 'replicated_deduplication_window_seconds'"
    )
    return int(rows[0]["value"]) if rows else 3600


def ensure_window(
    client: ClickHouseHTTP, target: Target, first: BlockPoint, xid: str, now: BlockPoint | None = None
) -> BlockPoint:
    """Raise :class:`DedupWindowError` if the table's blocks since ``first`` fill its
    window or may have aged out of it (a refusal is confirmed with a fresh read of the
    window); the current point (``now`` when the caller read it, else read here)."""
    now = read_points(client, [target])[0] if now is None else now
    try:
        check_window(first, now, dedup_window(client, target), target, xid)
    except DedupWindowError:
        check_window(first, now, dedup_window(client, target, fresh=True), target, xid)
    return now


#: (url, database, table) -> (the tables its materialized views write into, monotonic time read).
_VIEW_TABLES: dict[tuple[str, str, str], tuple[tuple[tuple[str, str], ...], float]] = {}


def view_targets(target: Target) -> list[Target]:
    """The tables the target's materialized views write into (down chains), as Targets.

    Read at most once per ``WINDOW_CACHE_S``.

    Executor (each prepare) and driver (each commit): their dedup windows are checked as
    the target's is, since a replayed block is dropped from a view's table only while
    the view's token is still in that table's window.
    """
    key = (target.url, target.database, target.table)
    hit = _VIEW_TABLES.get(key)
    if hit is None or time.monotonic() - hit[1] >= WINDOW_CACHE_S:
        hit = (tuple(view_tables(dependent_views(target))), time.monotonic())
        _VIEW_TABLES[key] = hit
    return [dataclasses.replace(target, database=d, table=t) for d, t in hit[0]]


def ensure_view_windows(
    client: ClickHouseHTTP,
    views: Sequence[Target],
    first: Mapping[str, BlockPoint],
    xid: str,
    now: Sequence[BlockPoint] | None = None,
) -> None:
    """:func:`ensure_window` for each view's table whose first point ``first`` holds
    (``now``: their current points when the caller read them, in ``views``' order)."""
    for i, v in enumerate(views):
        point = first.get(f"{v.database}.{v.table}")
        if point is not None:
            ensure_window(client, v, point, xid, None if now is None else now[i])


def points_to_details(points: Mapping[str, BlockPoint]) -> dict[str, Any]:
    """``first_view_blocks`` of ``Prepared.details``: each view's table's point, JSON."""
    return {name: p.to_details() for name, p in points.items()}


def points_from_details(value: object) -> dict[str, BlockPoint]:
    """The points :func:`points_to_details` wrote (or an earlier version's numbers)."""
    if not isinstance(value, Mapping):
        return {}
    return {str(name): BlockPoint.from_details(p) for name, p in value.items()}


def earliest_first_points(details: Sequence[Mapping[str, Any]]) -> tuple[BlockPoint | None, dict[str, BlockPoint]]:
    """Driver, checking a batch's partitions together: from their ``Prepared.details``, the
    :func:`earliest` first point of the target (None if no partition inserted) and of
    each view's table."""
    firsts = [BlockPoint.from_details(d["first_block"]) for d in details if d.get("first_block") is not None]
    per_view: dict[str, list[BlockPoint]] = {}
    for d in details:
        for name, point in points_from_details(d.get("first_view_blocks")).items():
            per_view.setdefault(name, []).append(point)
    views = {name: earliest(points) for name, points in per_view.items()}
    return (earliest(firsts) if firsts else None), views
