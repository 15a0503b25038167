"""The ``foreachBatch`` helper in mode ``dedup``: what a key's first attempt writes, so a replay
carrying other rows is refused instead of inserted twice.

Driver, once per micro-batch and call, after the key read found nothing
(:mod:`clickhouse_tx.foreach.dedup` calls it between ordering the rows and the
first chunk). A chunk's token is made of the key and the chunk's rows, so a replay
whose rows carry other bytes (a ``sum`` of doubles over a shuffle, ``collect_list``,
``first``, a timestamp of the call, ``rand()``) sends other tokens, and ClickHouse
would keep both its rows and the killed attempt's. So, just before its first chunk,
an attempt records what it is about to write, per table: the rows, the dead letters
and a digest of its chunks (:class:`TableContent`), in one KeeperMap record of
``clickhouse_tx_layouts`` (:func:`record_key`, created if absent under
``keeper_map_strict_mode``: the first writer wins). An attempt that finds a record:

- with the same content (the same rows in any order or partitioning cut into the same
  chunks) goes on: its chunks carry the first attempt's tokens, and ClickHouse drops
  the blocks it holds;
- with other content is refused before it sends any chunk (:func:`replay_differs`,
  a :class:`~clickhouse_tx.errors.ConfigurationError` naming the tables, both contents,
  the likely non-deterministic inputs and what to do).

Why a record never blocks a replay that could go on. The record is made only once
every chunk's digest is known, just before the first chunk is sent, so an attempt
stopped earlier (in the collect, the ordering, the hashing) leaves none, and its
replay writes whatever rows it has. An attempt whose first INSERT fails with an
error that says nothing was sent (:class:`~clickhouse_tx.errors.TransientError`)
drops the record it created. What stays is a record whose attempt may have sent a
chunk: whether a block with its token is in the table cannot be read back (the
deduplication log is not queryable), so a replay with other rows is refused, never
guessed (``docs/protocol.md``, "The foreachBatch helper's first-attempt records").

Lifetime: the key row of batch ``b`` drops the record of ``b - 1`` (Spark runs batch
``b`` only once ``b - 1`` is in its commit log, so no replay of ``b - 1`` comes);
``gc`` drops one older than its retention once its batch has a key row, or its
``app_id`` a later one (:func:`~clickhouse_tx.modes.dedup.lifetime.expired_content_keys`).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import re
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import pyarrow as pa

from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.foreach.key_check import BatchKey
from clickhouse_tx.foreach.keys import key_session
from clickhouse_tx.ids import sanitize_txn
from clickhouse_tx.interfaces import Mode, Target
from clickhouse_tx.modes.dedup.records import CONTENT_PARTITION, LAYOUT_TABLE
from clickhouse_tx.store.registry import KeeperMapRegistry


@dataclasses.dataclass(frozen=True)
class TableContent:
    """What one table of a micro-batch holds, as a replay must repeat it (pure).

    Attributes
    ----------
    rows
        Rows sent (dead letters not counted).
    digest
        :func:`content_digest` of the table's chunks.
    dead_letters
        Rows the conversion set aside for the dead-letter table.
    """

    rows: int
    digest: str
    dead_letters: int = 0

    def describe(self) -> str:
        dead = f", {self.dead_letters} dead letters" if self.dead_letters else ""
        return f"{self.rows} rows{dead}, digest {self.digest[:16]}"


def content_digest(chunks: Iterable[tuple[int, str]]) -> str:
    """SHA-256 of a table's chunks, each ``(rows, chunk digest)``, as a multiset (pure).

    The multiset of a table's chunks is the multiset of the tokens its INSERTs carry
    (a token is the key, the table, the chunk's digest and how many equal chunks came
    before it), so two attempts with equal digests send the same tokens, whatever
    order their parts came in. The dead letters' own content digest is one more
    element (``(n, "dead_letters:<digest>")``).
    """
    h = hashlib.sha256()
    for rows, digest in sorted(chunks, key=lambda c: (c[1], c[0])):
        h.update(f"{rows}:{digest}\n".encode())
    return h.hexdigest()[:32]


def record_key(key: BatchKey) -> str:
    """The KeeperMap key of ``key``'s record: its session's name (app_id, batch and a digest of its tables)."""
    return f"{key_session(key)}/contents"


def record_txn(app_id: str) -> str:
    """The ``txn_id`` column of an ``app_id``'s records: not a sink query's (the prefix and ``:``)."""
    return f"clickhouse_tx_fb:{sanitize_txn(app_id)}"


def differing(recorded: Mapping[str, Any], mine: Mapping[str, TableContent]) -> list[str]:
    """The tables whose content in ``mine`` is not the one ``recorded`` (a record's ``tables``), sorted (pure)."""
    names = set(recorded) | set(mine)
    return sorted(t for t in names if t not in recorded or t not in mine or _content(recorded[t]) != mine[t])


def _content(body: Mapping[str, Any]) -> TableContent:
    return TableContent(int(body["rows"]), str(body["digest"]), int(body.get("dead_letters", 0)))


def record_body(key: BatchKey, content: Mapping[str, TableContent], attempt: str, now_ms: int) -> dict[str, Any]:
    """What an attempt records before its first chunk (pure)."""
    return {
        "app_id": key.app_id,
        "batch": key.batch_id,
        "query_id": key.query_id,
        "attempt": attempt,
        "recorded_ms": now_ms,
        "tables": {t: dataclasses.asdict(c) for t, c in sorted(content.items())},
    }


#: Spark functions whose results may differ when a micro-batch is computed again over the
#: same input, as the analyzed plan spells them, and why.
UNSTABLE_FUNCTIONS: Mapping[str, str] = {
    "sum": "sum of doubles: the addition order after a shuffle changes the last bits",
    "avg": "avg of doubles: the addition order after a shuffle changes the last bits",
    "stddev|variance|var_samp|var_pop|stddev_samp|stddev_pop|corr|covar_samp|covar_pop": (
        "statistics of doubles: the addition order changes the last bits"
    ),
    "collect_list|collect_set|array_agg": "collect_list/collect_set: the elements' order follows the shuffle",
    "first|last|first_value|last_value|any_value": "first/last: which row comes first follows the shuffle",
    "monotonically_increasing_id|spark_partition_id": "ids made of the partitioning",
    "rand|randn|uuid|shuffle": "random values",
    "current_timestamp|now|current_date|localtimestamp|unix_timestamp": "the time of the run",
    "input_file_name": "file names as a run lists them",
}


def unstable_inputs(plan: str, schema: pa.Schema | None = None) -> list[str]:
    """The likely non-deterministic inputs of a table's rows (pure; driver, only for a refusal).

    ``plan``: the Spark plan of the DataFrame the helper got ('' when unknown), searched
    for :data:`UNSTABLE_FUNCTIONS`; ``schema``: the rows' Arrow schema, whose floating
    point and list columns are the usual carriers of such values.
    """
    found = []
    for names, why in UNSTABLE_FUNCTIONS.items():
        hits = sorted({m.lower() for m in re.findall(rf"\b({names})\(", plan, flags=re.IGNORECASE)})
        if hits:
            found.append(f"{'/'.join(hits)} in the plan ({why})")
    if schema is not None:
        floats = [f.name for f in schema if pa.types.is_floating(f.type)]
        lists = [f.name for f in schema if pa.types.is_list(f.type) or pa.types.is_large_list(f.type)]
        if floats:
            found.append(f"floating-point columns {floats}")
        if lists:
            found.append(f"list columns {lists}")
    return found


def replay_differs(
    key: BatchKey, recorded: Mapping[str, Any], mine: Mapping[str, TableContent], hints: Mapping[str, Sequence[str]]
) -> ConfigurationError:
    """The refusal of a replay whose rows are not the ones its first attempt recorded (pure).

    ``hints``: per table, :func:`unstable_inputs`.
    """
    tables = recorded.get("tables", {})
    diffs = differing(tables, mine)
    when = datetime.datetime.fromtimestamp(int(recorded.get("recorded_ms", 0)) / 1000, datetime.UTC)
    parts = []
    for t in diffs:
        was = _content(tables[t]).describe() if t in tables else "nothing"
        now = mine[t].describe() if t in mine else "nothing"
        why = "; ".join(hints.get(t, ())) or "none found in the plan or the columns"
        parts.append(f"{t}: first attempt {was}, this replay {now} (likely non-deterministic inputs: {why})")
    return ConfigurationError(
        f"clickhouse_tx_batch mode 'dedup', app_id={key.app_id!r}, batch {key.batch_id}: this replay of the "
        f"micro-batch carries other rows than its first attempt (attempt {recorded.get('attempt')}, recorded "
        f"{when:%Y-%m-%d %H:%M:%S} UTC before its first chunk): {'; '.join(parts)}. The first attempt's rows may "
        "be in the table already, wholly or in part (mode dedup makes them visible as they go in), and this "
        "replay's would go in beside them under other deduplication tokens; nothing of this replay was written, "
        "and every restart on this checkpoint stops here. The rows of a micro-batch must depend only on its "
        "source offsets. What to do: write the stream in mode 'transaction' (a replay rolls the killed attempt "
        "back whole, nothing to compare; non-replicated MergeTree with server transactions), or make the rows "
        "replay-stable (round the doubles, e.g. round(sum(x), 9); sort collected lists, array_sort(collect_list(x)); "
        "order before first/last; no rand or current_timestamp), then start under a new app_id: this batch is "
        "written again there, so remove the first attempt's rows of it first. If the table holds none of them, "
        f"deleting the record ({record_key(key)!r} in {LAYOUT_TABLE}) lets the replay write its own rows"
    )


class ContentRecords:
    """The helper's first-attempt records of one database (KeeperMap ``clickhouse_tx_layouts``; driver)."""

    def __init__(self, target: Target) -> None:
        self.registry = KeeperMapRegistry(target, table=LAYOUT_TABLE, database=target.database)

    def claim(
        self,
        key: BatchKey,
        content: Mapping[str, TableContent],
        attempt: str,
        hints: Callable[[], Mapping[str, Sequence[str]]],
    ) -> bool:
        """Record ``content`` for ``key`` unless recorded; whether this attempt made the record.

        One KeeperMap INSERT (and one read when a record is there). ``hints``: per table,
        :func:`unstable_inputs`, called only for a refusal.

        Raises
        ------
        ConfigurationError
            The record holds other content (:func:`replay_differs`); nothing was sent.
        """
        body = record_body(key, content, attempt, int(time.time() * 1000))
        text = json.dumps(body, sort_keys=True)
        stored = self.registry.create_record(
            record_key(key),
            text,
            txn_id=record_txn(key.app_id),
            batch=key.batch_id,
            partition=CONTENT_PARTITION,
            mode=Mode.DEDUP,
        )
        if stored == text:
            return True
        recorded = json.loads(stored)
        if differing(recorded.get("tables", {}), content):
            raise replay_differs(key, recorded, content, hints())
        return False

    def drop(self, key: BatchKey) -> None:
        """Drop ``key``'s record (its attempt sent nothing, or its batch is written)."""
        self.registry.forget([record_key(key)])

    def drop_before(self, key: BatchKey) -> None:
        """After ``key``'s row: drop the record of the batch before (Spark replays no batch before this one)."""
        if key.batch_id > 0:
            self.drop(dataclasses.replace(key, batch_id=key.batch_id - 1))


__all__ = [
    "UNSTABLE_FUNCTIONS",
    "ContentRecords",
    "TableContent",
    "content_digest",
    "differing",
    "record_body",
    "record_key",
    "record_txn",
    "replay_differs",
    "unstable_inputs",
]
