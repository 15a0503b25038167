"""Mode ``dedup``: how long a batch's layout records live, and which ones ``gc`` may drop.

The records (claims, chunk records, first-run records, seals;
:mod:`clickhouse_tx.modes.dedup.claims`) bind a replay of their batch only while the
batch is not committed. Each is dropped by the commit that makes it useless:

- a stream's batch ``b``: by the commit of ``b + 1`` (Spark replays only the last
  batch; :meth:`~clickhouse_tx.modes.dedup.replay_guard.ReplayGuard.seal`);
- a batch job's one batch: once the job is done (published, or committed partition by
  partition), or aborted when no run can resume it
  (:meth:`~clickhouse_tx.modes.dedup.mode.DedupMode.forget_batch`, called by the Spark writer);
- whatever a stopped stream's last batch or a killed job leaves: by ``gc`` once it is
  older than the retention and its batch is committed (:func:`expired_keys`, pure).

The ``foreachBatch`` helper's first-attempt records (mode ``dedup``,
:mod:`clickhouse_tx.foreach.contents`) live in the same table as one more kind: the
key row of batch ``b`` drops the record of ``b - 1``, and ``gc`` drops one older than
the retention once its batch has its key row or its ``app_id`` a later one
(:func:`expired_content_keys`); they are no sink batch's records (:func:`by_batch`).

A replay that comes after its batch's records are gone never inserts twice: every
partition of a committed batch has a marker, so a replay's partition with a marker
inserts nothing, and one without a marker in a batch that has some while its seal is
gone is refused (:func:`records_gone_error`, raised before its first chunk). gc never
drops an unsealed batch's records (an earlier run's inserted rows may be waiting for
its replay to re-check them) nor a sealed batch not wholly committed (the seal binds
the replay that rolls it forward).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Collection, Iterable, Mapping, Sequence

from clickhouse_tx.errors import DedupLayoutError
from clickhouse_tx.modes.dedup.claims import Part, way_out
from clickhouse_tx.modes.dedup.records import CONTENT_PARTITION, FIRST_RUN_PARTITION, SEAL_PARTITION

#: A batch of a query: (txn_id, batch).
BatchRef = tuple[str, int]
#: The kinds of layout records, as ``status`` counts them.
KINDS = ("claims", "chunk_records", "seals", "first_run", "foreach_batch")
#: A helper's key row as ``gc`` reads it: (app_id, batch_id, tables).
KeyRow = tuple[str, int, frozenset[str]]


@dataclasses.dataclass(frozen=True)
class LayoutRow:
    """One layout record as ``gc`` and ``status`` read it (a KeeperMap row).

    Attributes
    ----------
    key
        Its KeeperMap key (``<txn>/<batch>/...``).
    txn_id, batch, partition, attempt
        The columns: a seal's and a first-run record's partition are markers of the kind;
        a chunk record's ``attempt`` is its chunk number (> 0).
    updated_ms
        When it was last written (milliseconds since the epoch).
    seal
        The partitions a seal names (None for the other kinds).
    content
        A helper's first-attempt record (``app_id``, ``batch``, ``tables``, ...; None
        for the other kinds).
    """

    key: str
    txn_id: str
    batch: int
    partition: int
    attempt: int
    updated_ms: int
    seal: Mapping[int, Part] | None = None
    content: Mapping[str, Any] | None = None

    @property
    def kind(self) -> str:
        """One of :data:`KINDS`."""
        if self.partition == SEAL_PARTITION:
            return "seals"
        if self.partition == FIRST_RUN_PARTITION:
            return "first_run"
        if self.partition == CONTENT_PARTITION:
            return "foreach_batch"
        return "chunk_records" if self.attempt > 0 else "claims"


def count_kinds(rows: Iterable[LayoutRow]) -> dict[str, int]:
    """How many records of each kind (every kind present, 0 when none)."""
    counts = collections.Counter(r.kind for r in rows)
    return {k: counts.get(k, 0) for k in KINDS}


def by_batch(rows: Iterable[LayoutRow]) -> dict[BatchRef, list[LayoutRow]]:
    """The sink's records grouped by their batch (the helper's records are no sink batch's)."""
    out: dict[BatchRef, list[LayoutRow]] = collections.defaultdict(list)
    for r in rows:
        if r.kind != "foreach_batch":
            out[(r.txn_id, r.batch)].append(r)
    return dict(out)


def old_batches(rows: Iterable[LayoutRow], cut_ms: int) -> dict[BatchRef, Mapping[int, Part] | None]:
    """The batches whose every record was last written at or before ``cut_ms``: their
    seals (None for a batch without one). Which of them expire depends on their markers
    (:func:`expired_keys`)."""
    out = {}
    for ref, batch in by_batch(rows).items():
        if max(r.updated_ms for r in batch) <= cut_ms:
            out[ref] = next((r.seal for r in batch if r.seal is not None), None)
    return out


def expired_keys(
    rows: Sequence[LayoutRow], marked: Mapping[BatchRef, Collection[int]], cut_ms: int
) -> dict[BatchRef, list[str]]:
    """The records ``gc`` drops, by batch (pure).

    Parameters
    ----------
    rows
        Every layout record of the table.
    marked
        Per batch, the partitions that hold a commit marker.
    cut_ms
        The retention's edge: only batches whose every record was last written at or
        before it are dropped.

    Returns
    -------
    dict
        The keys of every old enough batch that is committed: sealed with a marker for
        each partition its seal names, or without a seal but with markers (the seal,
        written before any marker, was dropped already: what a failed drop left).
        Unsealed batches without markers (a run that inserted and died before its
        commit) and sealed batches not wholly committed are kept: a replay needs them.
    """
    groups = by_batch(rows)
    out = {}
    for ref, seal in sorted(old_batches(rows, cut_ms).items()):
        have = set(marked.get(ref, ()))
        if (seal is not None and set(seal) <= have) or (seal is None and have):
            out[ref] = sorted(r.key for r in groups[ref])
    return out


def expired_content_keys(rows: Sequence[LayoutRow], key_rows: Iterable[KeyRow], cut_ms: int) -> list[str]:
    """The helper's first-attempt records ``gc`` drops (pure).

    Parameters
    ----------
    rows
        Every layout record of the table (the other kinds are left alone).
    key_rows
        The key rows of the records' ``app_id``s: of their batches, and each ``app_id``'s newest.
    cut_ms
        The retention's edge: only records last written at or before it are dropped.

    Returns
    -------
    list
        The keys of the old records whose batch is written: a key row of the same
        ``app_id``, batch and tables, or a key row of a later batch of the ``app_id``
        (Spark runs batch ``b + 1`` only once ``b`` is in its commit log, so ``b`` is never
        replayed). A record whose batch has neither (a driver killed before the key row)
        is kept however old: its replay compares with it.
    """
    written: set[KeyRow] = set()
    newest: dict[str, int] = {}
    for app, batch, tables in key_rows:
        written.add((app, batch, tables))
        newest[app] = max(newest.get(app, batch), batch)
    out = []
    for r in rows:
        if r.kind != "foreach_batch" or r.content is None or r.updated_ms > cut_ms:
            continue
        app, tables = str(r.content.get("app_id")), frozenset(r.content.get("tables", {}))
        if newest.get(app, -1) > r.batch or (app, r.batch, tables) in written:
            out.append(r.key)
    return sorted(out)


def records_gone_error(txn_id: str, batch: int, partition: int, marked: Collection[int]) -> DedupLayoutError:
    """Executor, before a partition's first chunk: the refusal of a partition its batch's
    committed run did not commit, once the batch's layout records are gone.

    The batch holds markers (some run committed partitions ``marked``) and no seal: its
    records were dropped as useless (the next batch's commit, the job's end, or ``gc``
    after the retention). Without them this partition cannot be compared with the rows
    already in the table, so it is refused before it inserts, never inserted twice.
    """
    return DedupLayoutError(
        f"batch {batch} of {txn_id}, partition {partition}: partitions {sorted(marked)} of this batch "
        "are committed, and its layout records (mode dedup) are gone: they are dropped once the batch is "
        "committed (by the next batch's commit, at the end of a batch job, or by python -m clickhouse_tx "
        "gc after its retention). This run's partition is not one the committed run had, so it may hold "
        f"rows that are in the table already; nothing of it was inserted. {way_out(txn_id)}"
    )


__all__ = [
    "KINDS",
    "BatchRef",
    "LayoutRow",
    "by_batch",
    "KeyRow",
    "count_kinds",
    "expired_content_keys",
    "expired_keys",
    "old_batches",
    "records_gone_error",
]
