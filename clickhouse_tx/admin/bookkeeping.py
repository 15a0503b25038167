"""The project's own records in a database: how many there are (``status``), and their retention (``gc``).

Runs on an operator's machine (``python -m clickhouse_tx status|gc``), once per call,
possibly while queries write. The records:

=====================  ==============================  =========================================
table                  records                          dropped by
=====================  ==============================  =========================================
``clickhouse_tx_layouts``  mode ``dedup``'s claims, chunk   the next batch's commit (a stream), the
(KeeperMap)            records, seals, first-run        job's end (a batch job); ``gc``: a
                       records                          committed batch past the retention
                                                        (:func:`~clickhouse_tx.modes.dedup.lifetime.expired_keys`)
                       the ``foreachBatch`` helper's    the next batch's key row; ``gc``: past the
                       first-attempt records (dedup)    retention once the batch has its key row
                                                        or its ``app_id`` a later one
``clickhouse_tx_registry``  xids; Spark abort's run fences  a done batch's commit (xids); ``gc``: the
(KeeperMap)                                             fences past the retention
``clickhouse_tx_batches``  the ``foreachBatch`` helper's   ``gc``: every row past the retention but
(MergeTree)            key rows                         the newest of each ``app_id``
``clickhouse_tx_jobs``  published batch jobs            ``gc``: rows without an ``idempotence_key``
(MergeTree)                                             past the retention (keyed rows stay: the
                                                        key is the user's promise)
=====================  ==============================  =========================================

What ``gc`` costs: KeeperMap filters on anything but the key by reading every key, so
the retention pass reads each KeeperMap table once (every key of ``clickhouse_tx_layouts``
and, for the fences, of the registry), reads the markers of the old batches in one
query, and deletes by key, :data:`DELETE_KEYS` keys a request; each MergeTree table gets
one read and one ``ALTER TABLE ... DELETE`` (a mutation). Since every commit drops what
it makes useless, the tables hold about one batch in flight per query, and the reads stay
that size.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Callable, Collection, Mapping, Sequence

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.foreach.keys import BATCHES_TABLE
from clickhouse_tx.ids import RUN_FENCE_PREFIX
from clickhouse_tx.interfaces import Target
from clickhouse_tx.jobs.publish import JOBS_TABLE
from clickhouse_tx.modes.dedup.lifetime import (
    BatchRef,
    KeyRow,
    LayoutRow,
    by_batch,
    count_kinds,
    expired_content_keys,
    expired_keys,
    old_batches,
)
from clickhouse_tx.modes.dedup.records import CONTENT_PARTITION, LAYOUT_TABLE, SEAL_PARTITION
from clickhouse_tx.store.markers import MARKERS_TABLE, CommittedReader
from clickhouse_tx.store.registry import FINISHED_STATES, KeeperMapRegistry

#: Keys per ``ALTER TABLE ... DELETE`` of a KeeperMap table.
DELETE_KEYS = 1000
#: The retention ``gc`` keeps records for when the operator gives none (3 days).
DEFAULT_RETENTION_S = 3 * 86400.0
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """``3d``, ``12h``, ``90m``, ``600s`` or ``600`` (seconds) as seconds."""
    text = text.strip().lower()
    unit = _UNITS.get(text[-1:]) if text else None
    value = float(text[:-1] if unit is not None else text)
    if value < 0:
        raise ValueError(f"a duration cannot be negative: {text!r}")
    return value * (unit or 1.0)


@dataclasses.dataclass(frozen=True)
class BookkeepingReport:
    """What the retention pass of ``gc`` dropped (keys, or rows of the MergeTree tables)."""

    layout_records: int = 0
    layout_batches: tuple[str, ...] = ()  # "<txn>/<batch>" of each batch whose records went; helper records' keys
    run_fences: int = 0
    key_rows: int = 0
    job_rows: int = 0


def _tables(c: ClickHouseHTTP, database: str) -> set[str]:
    rows = c.query_json("SELECT name FROM system.tables WHERE database = {d:String}", params={"d": database})
    return {str(r["name"]) for r in rows}


def layout_rows(c: ClickHouseHTTP, database: str) -> list[LayoutRow]:
    """Every layout record of ``database`` (one read of every key; seals and the helper's records
    with their bodies)."""
    if LAYOUT_TABLE not in _tables(c, database):
        return []
    bodies = f"`partition` IN ({SEAL_PARTITION}, {CONTENT_PARTITION})"
    sql = (
        "SELECT xid, txn_id, batch, `partition`, attempt, updated_ms, "
        f"if({bodies}, payload, '') AS payload FROM {q.qualified(database, LAYOUT_TABLE)}"
    )
    return [_row(r) for r in c.query_json(sql)]


def _row(r: Mapping[str, Any]) -> LayoutRow:
    seal, content = None, None
    body = json.loads(json.loads(str(r["payload"]))["body"]) if r["payload"] else None
    if body is not None and int(r["partition"]) == CONTENT_PARTITION:
        content = body
    elif body is not None:
        seal = {int(p): v for p, v in body.items()}
    return LayoutRow(
        str(r["xid"]),
        str(r["txn_id"]),
        int(r["batch"]),
        int(r["partition"]),
        int(r["attempt"]),
        int(r["updated_ms"]),
        seal,
        content,
    )


def content_key_rows(c: ClickHouseHTTP, database: str, rows: Sequence[LayoutRow], cut_ms: int) -> list[KeyRow]:
    """The key rows that tell whether the helper's old records are written (one read-committed
    query): those of the records' batches, and each of their ``app_id``'s newest."""
    old = {(str(r.content["app_id"]), r.batch) for r in rows if r.content is not None and r.updated_ms <= cut_ms}
    if not old or BATCHES_TABLE not in _tables(c, database):
        return []
    fq, apps = q.qualified(database, BATCHES_TABLE), q.quote_strings(sorted({a for a, _ in old}))
    sql = (
        f"SELECT app_id, batch_id, tables FROM {fq} WHERE (app_id, batch_id) IN ({_tuples(sorted(old))}) "
        f"UNION ALL SELECT app_id, max(batch_id), argMax(tables, batch_id) FROM {fq} "
        f"WHERE app_id IN {apps} GROUP BY app_id"
    )
    return [(str(r["app_id"]), int(r["batch_id"]), frozenset(r["tables"])) for r in CommittedReader(c).query_json(sql)]


def marked_partitions(c: ClickHouseHTTP, database: str, refs: Collection[BatchRef]) -> dict[BatchRef, set[int]]:
    """The partitions of each batch of ``refs`` that hold a commit marker (one read-committed query)."""
    if not refs or MARKERS_TABLE not in _tables(c, database):
        return {}
    pairs = ", ".join(f"({q.quote_string(t)}, {int(b)})" for t, b in sorted(refs))
    sql = (
        f"SELECT DISTINCT txn_id, batch, `partition` FROM {q.qualified(database, MARKERS_TABLE)} "
        f"WHERE (txn_id, batch) IN ({pairs})"
    )
    out: dict[BatchRef, set[int]] = {}
    for r in CommittedReader(c).query_json(sql):
        out.setdefault((str(r["txn_id"]), int(r["batch"])), set()).add(int(r["partition"]))
    return out


def _count(c: ClickHouseHTTP, fq: str, where: str = "1") -> int:
    return int(c.query_json(f"SELECT count() AS n FROM {fq} WHERE {where}")[0]["n"])


def counts(target: Target, registry: KeeperMapRegistry) -> dict[str, Any]:
    """``status``: the records of each bookkeeping table (absent tables count 0).

    Reads every key of the two KeeperMap tables once and counts the MergeTree tables.
    """
    with ClickHouseHTTP(target) as c:
        rows = layout_rows(c, registry.database)
        undecided = sum(1 for s in old_batches(rows, 2**63).values() if s is None)
        doc: dict[str, Any] = {
            "layouts": {**count_kinds(rows), "batches": len(by_batch(rows)), "unsealed_batches": undecided},
            "registry": {"open": 0, "finished": 0, "run_fences": 0},
            "key_rows": 0,
            "job_rows": 0,
        }
        here, there = _tables(c, target.database), _tables(c, registry.database)
        if registry.table in there:
            fq, finished = q.qualified(registry.database, registry.table), q.quote_strings(FINISHED_STATES)
            fences = f"startsWith(xid, {q.quote_string(RUN_FENCE_PREFIX)})"
            doc["registry"] = {
                "open": _count(c, fq, f"state NOT IN {finished}"),
                "finished": _count(c, fq, f"state IN {finished} AND NOT {fences}"),
                "run_fences": _count(c, fq, fences),
            }
        for name, table in (("key_rows", BATCHES_TABLE), ("job_rows", JOBS_TABLE)):
            if table in here:
                doc[name] = _count(c, q.qualified(target.database, table))
    return doc


def gc_bookkeeping(
    target: Target, registry: KeeperMapRegistry, retention_s: float, *, clock: Callable[[], float] = time.time
) -> BookkeepingReport:
    """``gc``'s retention pass: drop the records older than ``retention_s`` that nothing needs.

    Needs no checkpoint and no query named: a layout record goes only with its whole
    batch, once that batch is committed (:func:`~clickhouse_tx.modes.dedup.lifetime.expired_keys`),
    a run fence once older than any straggler task, a key row unless it is its
    ``app_id``'s newest, a job row unless it holds an ``idempotence_key``. Why a replay
    after the retention never writes twice: ``docs/protocol.md``, "How long records live".
    """
    cut_ms = int((clock() - retention_s) * 1000)
    with ClickHouseHTTP(target) as c:
        rows = layout_rows(c, registry.database)
        old = old_batches(rows, cut_ms)
        expired = expired_keys(rows, marked_partitions(c, target.database, old), cut_ms)
        keys = [k for batch in expired.values() for k in batch]
        # Before the key rows' own pass below, which may drop the rows these are judged by.
        contents = expired_content_keys(rows, content_key_rows(c, registry.database, rows, cut_ms), cut_ms)
        keys += contents
        layouts = KeeperMapRegistry(target, table=LAYOUT_TABLE, database=registry.database)
        for i in range(0, len(keys), DELETE_KEYS):
            layouts.forget(keys[i : i + DELETE_KEYS])
        here = _tables(c, target.database)
        return BookkeepingReport(
            layout_records=len(keys),
            layout_batches=tuple(f"{t}/{b}" for t, b in expired) + tuple(contents),
            run_fences=_drop_fences(c, registry, cut_ms),
            key_rows=_drop_key_rows(c, target.database, cut_ms) if BATCHES_TABLE in here else 0,
            job_rows=_drop_job_rows(c, target.database, cut_ms) if JOBS_TABLE in here else 0,
        )


def _drop_fences(c: ClickHouseHTTP, registry: KeeperMapRegistry, cut_ms: int) -> int:
    """Spark abort's run fences older than ``cut_ms`` (a straggler task of the run is long gone)."""
    if registry.table not in _tables(c, registry.database):
        return 0
    fq = q.qualified(registry.database, registry.table)
    where = f"startsWith(xid, {q.quote_string(RUN_FENCE_PREFIX)}) AND updated_ms <= {cut_ms}"
    keys = [str(r["xid"]) for r in c.query_json(f"SELECT xid FROM {fq} WHERE {where}")]
    for i in range(0, len(keys), DELETE_KEYS):
        registry.forget(keys[i : i + DELETE_KEYS])
    return len(keys)


def _mutate(c: ClickHouseHTTP, fq: str, where: str) -> int:
    """``ALTER TABLE fq DELETE WHERE where`` (waited for); the rows it matched, counted first."""
    n = int(CommittedReader(c).query_json(f"SELECT count() AS n FROM {fq} WHERE {where}")[0]["n"])
    if n:
        c.command(f"ALTER TABLE {fq} DELETE WHERE {where}", settings={"mutations_sync": "2"})
    return n


def _drop_key_rows(c: ClickHouseHTTP, database: str, cut_ms: int) -> int:
    """Key rows older than ``cut_ms`` except each ``app_id``'s newest (the one a replay or
    another query's check reads: :func:`~clickhouse_tx.foreach.keys.check_recorded`)."""
    fq = q.qualified(database, BATCHES_TABLE)
    newest = CommittedReader(c).query_json(f"SELECT app_id, max(batch_id) AS b FROM {fq} GROUP BY app_id")
    keep = _tuples((str(r["app_id"]), int(r["b"])) for r in newest)
    return _mutate(c, fq, f"committed_at < {_time(cut_ms)} AND (app_id, batch_id) NOT IN ({keep})")


def _drop_job_rows(c: ClickHouseHTTP, database: str, cut_ms: int) -> int:
    """Published jobs' rows older than ``cut_ms`` that hold no ``idempotence_key`` (only the
    job's own lost-reply settle read them)."""
    fq = q.qualified(database, JOBS_TABLE)
    return _mutate(c, fq, f"committed_at < {_time(cut_ms)} AND idempotence_key = ''")


def _time(ms: int) -> str:
    return f"fromUnixTimestamp64Milli(toInt64({int(ms)}))"


def _tuples(pairs: Sequence[tuple[str, int]] | Any) -> str:
    """A ClickHouse list of ``(String, UInt64)`` tuples (one impossible tuple when empty)."""
    text = ", ".join(f"({q.quote_string(a)}, {int(b)})" for a, b in pairs)
    return text or "('', 18446744073709551615)"


__all__ = ["DEFAULT_RETENTION_S", "BookkeepingReport", "counts", "gc_bookkeeping", "layout_rows", "parse_duration"]
