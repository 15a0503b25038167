"""Mode ``dedup``: the deduplication window a replay relies on, read and checked (before
each chunk in one statement with the attempt's fence).

ClickHouse remembers the tokens of the last ``*_deduplication_window`` blocks of a
table. A partition's chunks are deduplicated on replay only while its first chunk's
token is still remembered, so the executor (before each chunk) and the driver (before
the marker) check that fewer parts went into the table since that first chunk than
the window holds, for the target and for every table its materialized views write into.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Mapping, Sequence

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.conversion.schema import describe_table
from clickhouse_tx.errors import DedupWindowError, NotCommittedError
from clickhouse_tx.interfaces import Target
from clickhouse_tx.modes.views import dependent_views, view_tables
from clickhouse_tx.protocol.state import TxState

if TYPE_CHECKING:  # pragma: no cover
    from clickhouse_tx.store.registry import KeeperMapRegistry


def max_block_number(client: ClickHouseHTTP, target: Target) -> int:
    """The table's highest block number: one more for every part an INSERT writes.

    Every part written (one per table partition an insert block touches) is one
    entry of the dedup window, so the difference of two readings bounds how many
    entries were added in between.
    """
    rows = client.query_json(_max_block_sql(target))
    return int(rows[0]["b"] or 0) if rows else 0


def _max_block_sql(target: Target) -> str:
    """The ``SELECT`` of :func:`max_block_number` (column ``b``), also a scalar subquery."""
    where = f"database = {q.quote_string(target.database)} AND table = {q.quote_string(target.table)}"
    return f"SELECT max(max_block_number) AS b FROM system.parts WHERE {where}"


def fence_and_blocks(
    client: ClickHouseHTTP, registry: "KeeperMapRegistry", xid: str, tables: Sequence[Target]
) -> list[int]:
    """Executor, before each chunk: refuse to insert once ``xid`` left INITIALIZED (fenced
    by the driver or GC); else :func:`max_block_number` of each of ``tables``.

    One statement when the registry is on the server of ``client`` (the xid registered
    before its prepare, so its table is there): the server runs the two reads one after
    the other as two requests would, but the request's own cost is paid once
    (``python -m benchmarks.merged_reads``). Else the registry's read, then the blocks'.
    """
    if registry.target.url == client.target.url:
        fq = q.qualified(registry.database, registry.table)
        blocks = "".join(f", ({_max_block_sql(t)}) AS b{i}" for i, t in enumerate(tables))
        row = client.query_json(
            f"SELECT (SELECT state FROM {fq} WHERE xid = {q.quote_string(xid)} LIMIT 1) AS s{blocks}"
        )
        state, found = row[0]["s"], [int(row[0][f"b{i}"] or 0) for i in range(len(tables))]
    else:
        entry = registry.get(xid)
        state, found = (None if entry is None else entry.state), [max_block_number(client, t) for t in tables]
    if state != TxState.INITIALIZED.value:
        raise NotCommittedError(
            f"dedup insert refused: the registry says this attempt is {state or 'not registered'}, so it "
            "was fenced (a newer attempt or the driver's abort replaced it)",
            xid=xid,
        )
    return found


#: (url, database, table) -> (window, monotonic time read). Spark reuses Python
#: workers, so most prepares skip the three queries of describe_table.
_WINDOWS: dict[tuple[str, str, str], tuple[int, float]] = {}
#: How long a window read stays good: an ALTER of the window is seen within this.
WINDOW_CACHE_S = 30.0


def dedup_window(client: ClickHouseHTTP, target: Target, *, fresh: bool = False) -> int:
    """The table's dedup window (replicated or not), in parts; read at most once per ``WINDOW_CACHE_S``."""
    key = (target.url, target.database, target.table)
    hit = _WINDOWS.get(key)
    if hit is not None and not fresh and time.monotonic() - hit[1] < WINDOW_CACHE_S:
        return hit[0]
    info = describe_table(client, target.database, target.table)
    window = info.replicated_dedup_window if info.is_replicated else info.non_replicated_dedup_window
    _WINDOWS[key] = (window, time.monotonic())
    return window


def ensure_window(client: ClickHouseHTTP, target: Target, first_block: int, xid: str, block: int | None = None) -> int:
    """Raise :class:`DedupWindowError` if the table's parts since ``first_block`` fill its
    window (a refusal is confirmed with a fresh read of the window); the current block
    (``block`` when the caller read it, else read here)."""
    block = max_block_number(client, target) if block is None else block
    try:
        check_window(first_block, block, dedup_window(client, target), target, xid)
    except DedupWindowError:
        check_window(first_block, block, dedup_window(client, target, fresh=True), target, xid)
    return block


def check_window(first_block: int, current_block: int, window: int, target: Target, xid: str) -> None:
    """Raise :class:`DedupWindowError` if the parts since ``first_block`` fill ``window``."""
    since = current_block - first_block
    if since >= window:
        raise DedupWindowError(
            f"{since} parts were inserted into {target.database}.{target.table} since this "
            f"partition's first chunk, and its dedup window holds {window}: the tokens of its "
            f"first chunks may have left the window, so a replay could duplicate rows. Raise it "
            f"(ALTER TABLE {q.qualified(target.database, target.table)} MODIFY SETTING "
            f"non_replicated_deduplication_window = {max(1000, 4 * since)}, or "
            "replicated_deduplication_window for a Replicated table) or write smaller batches",
            xid=xid,
        )


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
    first: Mapping[str, object],
    xid: str,
    blocks: Sequence[int] | None = None,
) -> None:
    """:func:`ensure_window` for each view's table whose first block ``first`` holds
    (``blocks``: their current blocks when the caller read them, in ``views``' order)."""
    for i, v in enumerate(views):
        block = first.get(f"{v.database}.{v.table}")
        if block is not None:
            ensure_window(client, v, int(str(block)), xid, None if blocks is None else blocks[i])
