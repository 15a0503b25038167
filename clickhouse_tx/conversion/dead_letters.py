"""Dead letters: rows holding a value that does not fit, kept instead of failing the task.

With ``bad_rows=dead_letter`` the converter (:class:`clickhouse_tx.conversion.convert.ConvertedBatches`)
takes such a row out of its batch; the mode's prepare (executor, once per partition
attempt) writes the partition's dead letters with :func:`write_dead_letters` in the
same transaction as its good rows (mode ``transaction``), with a deduplication token
shared by every attempt of the partition (mode ``dedup``) or into a stage moved with
the partition's stage (mode ``staging``), so a replayed batch never
duplicates or loses one. The table is created on the driver with :func:`dead_letter_ddl`.
"""

from __future__ import annotations

import pyarrow as pa

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.conversion.convert import ConvertedBatches
from clickhouse_tx.interfaces import WriteContext

__all__ = ["DEAD_LETTER_COLUMNS", "dead_letter_ddl", "write_dead_letters"]

#: Columns of a dead-letter table (created by the writer on the driver when missing).
DEAD_LETTER_COLUMNS: tuple[tuple[str, str], ...] = (
    ("table", "String"),
    ("txn_id", "String"),
    ("batch", "Int64"),
    ("partition", "Int64"),
    ("xid", "String"),
    ("row", "UInt64"),
    ("column", "String"),
    ("clickhouse_type", "String"),
    ("reason", "String"),
    ("row_json", "String"),
)


def write_dead_letters(
    session: ClickHouseHTTP,
    batches: object,
    *,
    table: str,
    ctx: WriteContext,
    xid: str,
    token: str | None = None,
    stage: str | None = None,
) -> int:
    """Executor: insert the partition's dead letters through ``session``; their count.

    Called by a mode's prepare after the good rows went in: in mode ``transaction``
    in the same transaction (a replay of the batch rolls both back or commits both);
    in mode ``dedup`` with a ``token`` that is the same for every attempt of the
    partition (a replay's copy is dropped as a duplicate); in mode ``staging`` into
    ``stage`` (a quoted table name), the partition's dead-letter stage, moved into the
    dead-letter table with the rows at commit. ``batches`` is what the
    mode received; anything but a :class:`ConvertedBatches` with a dead-letter table
    has none.
    """
    if not isinstance(batches, ConvertedBatches) or batches.plan.dead_letter_table is None:
        return 0
    letters = batches.dead_letters
    if letters:
        n = len(letters)
        data = pa.record_batch(
            {
                "table": pa.array([table] * n),
                "txn_id": pa.array([ctx.txn_id] * n),
                "batch": pa.array([ctx.batch] * n, pa.int64()),
                "partition": pa.array([ctx.partition] * n, pa.int64()),
                "xid": pa.array([xid] * n),
                "row": pa.array([d["row"] for d in letters], pa.uint64()),
                **{k: pa.array([d[k] for d in letters]) for k in ("column", "clickhouse_type", "reason", "row_json")},
            }
        )
        into = stage or q.qualified(*batches.plan.dead_letter_table)
        session.insert_arrow_stream(
            into,
            data.schema,
            iter([data]),
            settings={"insert_deduplication_token": token or f"{xid}:dead_letters"},
            may_deduplicate=True,
        )
    return len(letters)


def dead_letter_ddl(database: str, table: str, *, dedup_window: bool = False) -> str:
    """``CREATE TABLE IF NOT EXISTS`` of a dead-letter table (driver, once per query).

    ``dedup_window`` (mode ``dedup``) gives it the deduplication window that drops a
    replay's copy by its token; mode ``transaction`` needs none (a rolled-back attempt
    leaves nothing) and its table gets none.
    """
    return q.record_table_ddl(
        q.qualified(database, table),
        DEAD_LETTER_COLUMNS,
        ("txn_id", "batch", "partition", "row"),
        "non_replicated_deduplication_window = 1000" if dedup_window else "",
    )
