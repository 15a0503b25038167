"""Commit markers: one row per committed xid in ``<target db>.clickhouse_tx_commits``.

A marker is the durable proof that an xid's rows are visible. In mode
``transaction`` it is inserted inside the xid's own transaction, so it becomes
visible exactly when the rows do (atomically); in ``staging`` and ``dedup`` it is
written by the driver after the rows are in. An in-doubt COMMIT is resolved by
looking for its marker, never by committing again blindly.

Every read uses ``implicit_transaction=1``: outside a transaction ClickHouse 26.9
shows rows of transactions that are still open (``docs/design.md`` §4), which would make an
uncommitted marker look committed. A server without experimental transactions
refuses that setting ("Transactions are not supported"); there no marker can be
uncommitted, so the read is repeated without it (modes ``staging`` and ``dedup``
need no transactions).

The checksum
------------
:func:`arrow_checksum` is a cheap, deterministic fingerprint of the rows of one
partition attempt, computed with ``pyarrow.compute`` kernels (no Python per row)
and independent of how the rows are split into record batches: per column, the
wrapping 64-bit sum of the values (integers, booleans, dates, timestamps,
decimals' storage), or of the value lengths (strings, binary), or of the list
lengths (lists, maps), plus the null count; floats contribute their null count
and their count of non-null values only (float sums depend on summation order).
Columns are mixed with distinct odd multipliers and the row count is added. It is
meant to catch lost or duplicated chunks when two attempts are compared, not to
be a cryptographic hash.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from clickhouse_tx import sql as q
from clickhouse_tx._transport import TABLE_ALREADY_EXISTS, UNKNOWN_TABLE, ClickHouseHTTP, transactions_unsupported
from clickhouse_tx.errors import ServerError
from clickhouse_tx.interfaces import Prepared, Target

MARKERS_TABLE = "clickhouse_tx_commits"
_MASK64 = (1 << 64) - 1
_MASK63 = (1 << 63) - 1

_COLUMNS: tuple[tuple[str, str], ...] = (
    ("txn_id", "String"),
    ("batch", "UInt64"),
    ("partition", "UInt32"),
    ("xid", "String"),
    ("table", "String"),  # "db.table", unquoted, as in Prepared.table
    ("rows", "UInt64"),
    ("checksum", "UInt64"),
    ("mode", "String"),
    ("committed_at", "DateTime64(3)"),
)
_NAMES = [c for c, _ in _COLUMNS]
_SELECT = ", ".join(q.quote_identifier(c) for c in _NAMES)
#: Reads see committed data only (see the module docstring). Put in the query text,
#: not in URL settings: it must apply to the SELECT alone, never to what a server
#: front may run on the connection before it (e.g. a ``USE``).
READ_COMMITTED = " SETTINGS implicit_transaction = 1"


# Tables this process has created or seen (Spark reuses Python workers across tasks).
_CREATED: set[tuple[str, str]] = set()


class CommittedReader:
    """SELECTs through ``client`` that see committed rows only.

    With ``implicit_transaction=1`` while the server takes it; once it refuses
    transactions (remembered by this object) no transaction can be open, so a plain
    read sees committed rows only. One per markers table or ``verify`` run.
    """

    def __init__(self, client: ClickHouseHTTP) -> None:
        self.client = client
        self.transactions = True  # until the server refuses implicit_transaction

    def query_json(self, sql: str, params: Mapping[str, object] | None = None) -> list[dict[str, Any]]:
        """The rows of ``sql`` (a SELECT without SETTINGS) as a read-committed reader sees them."""
        if self.transactions:
            try:
                return self.client.query_json(sql + READ_COMMITTED, params=params)
            except ServerError as e:
                if not transactions_unsupported(e):
                    raise
                self.transactions = False
        return self.client.query_json(sql, params=params)


class CommitMarkers:
    """The markers table of one target database.

    Parameters
    ----------
    target
        The markers live in ``target.database``.
    client
        A session-less client for reads and DDL (built from ``target`` if None).

    Notes
    -----
    Used on executors (mode ``transaction`` inserts the marker while preparing)
    and on the driver (lookups, markers of the other modes).
    """

    def __init__(self, target: Target, client: ClickHouseHTTP | None = None) -> None:
        self.target = target
        self.client = client or ClickHouseHTTP(target)
        self.fq = q.qualified(target.database, MARKERS_TABLE)
        self._committed = CommittedReader(self.client)

    def ensure_table(self) -> None:
        """Create the markers table if missing (idempotent; not inside a transaction)."""
        key = (self.target.url, self.fq)
        if key in _CREATED:
            return
        cols = ", ".join(f"{q.quote_identifier(c)} {t}" for c, t in _COLUMNS)
        ddl = (
            f"CREATE TABLE IF NOT EXISTS {self.fq} ({cols}) ENGINE = MergeTree "
            f"ORDER BY (txn_id, batch, `partition`, xid)"
        )
        try:
            self.client.command(ddl, idempotent=True)
        except ServerError as e:
            if e.code != TABLE_ALREADY_EXISTS:
                raise
        _CREATED.add(key)

    def insert_sql(self, p: Prepared, *more: Prepared) -> str:
        """The ``INSERT`` of the markers of ``p`` (and ``more``), one statement (any client/session)."""
        rows = ", ".join(f"({', '.join(self._values(x))})" for x in (p, *more))
        return f"INSERT INTO {self.fq} ({_SELECT}) VALUES {rows}"

    @staticmethod
    def _values(p: Prepared) -> list[str]:
        return [
            q.quote_string(p.txn_id),
            str(int(p.batch)),
            str(int(p.partition)),
            q.quote_string(p.xid),
            q.quote_string(p.table),
            str(int(p.rows)),
            str(int(p.checksum) & _MASK64),
            q.quote_string(p.mode.value),
            "now64(3)",
        ]

    def insert(self, p: Prepared, client: ClickHouseHTTP | None = None) -> None:
        """Insert ``p``'s marker through ``client`` (e.g. the xid's session) or our own."""
        (client or self.client).command(self.insert_sql(p))

    def _read(self, sql: str, params: dict[str, object]) -> list[dict[str, Any]]:
        """``sql`` read-committed (:class:`CommittedReader`)."""
        return self._committed.query_json(sql, params)

    def lookup(self, xid: str) -> dict[str, Any] | None:
        """The committed marker row of ``xid`` or None (read-committed; no table = None)."""
        try:
            rows = self._read(f"SELECT {_SELECT} FROM {self.fq} WHERE xid = {{x:String}} LIMIT 1", {"x": xid})
        except ServerError as e:
            if e.code == UNKNOWN_TABLE:  # nothing was ever committed here
                return None
            raise
        return rows[0] if rows else None

    def list(self, txn_id: str, batch: int | None = None) -> list[dict[str, Any]]:
        """Committed markers of one query (optionally one batch), ordered (read-committed)."""
        where = "txn_id = {t:String}"
        params: dict[str, object] = {"t": txn_id}
        if batch is not None:
            where += " AND batch = {b:UInt64}"
            params["b"] = int(batch)
        try:
            return self._read(f"SELECT {_SELECT} FROM {self.fq} WHERE {where} ORDER BY batch, `partition`, xid", params)
        except ServerError as e:
            if e.code == UNKNOWN_TABLE:
                return []
            raise


# ---------------------------------------------------------------------- checksum


def _column_sum(arr: pa.ChunkedArray | pa.Array) -> int:
    """Order-independent contribution of one column (see the module docstring)."""
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = (
            arr.cast(t.value_type)
            if isinstance(arr, pa.Array)
            else pa.chunked_array([c.cast(t.value_type) for c in arr.chunks], t.value_type)
        )
        t = arr.type
    nulls: int = arr.null_count
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        vals = pc.cast(arr, pa.int64(), safe=False) if not pa.types.is_int64(t) else arr
        s = pc.sum(vals).as_py() or 0
    elif pa.types.is_temporal(t):
        s = pc.sum(pc.cast(pc.cast(arr, _storage_int(t)), pa.int64(), safe=False)).as_py() or 0
    elif pa.types.is_decimal(t):
        # Each value as a whole number of units of its scale (deterministic per value).
        as_int = pc.cast(pc.multiply(pc.cast(arr, pa.float64()), 10**t.scale), pa.int64(), safe=False)
        s = pc.sum(as_int).as_py() or 0
    elif (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
    ):
        s = pc.sum(pc.binary_length(arr)).as_py() or 0
    elif pa.types.is_map(t):
        # list_value_length has no kernel for maps: count the entries from the offsets.
        chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
        s = sum(c.offsets[-1].as_py() - c.offsets[0].as_py() for c in chunks if len(c))
    elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        s = pc.sum(pc.list_value_length(arr)).as_py() or 0
    elif pa.types.is_floating(t):
        s = len(arr) - nulls
    else:
        s = len(arr) - nulls
    return (int(s) * 0x9E3779B97F4A7C15 + nulls * 0xC2B2AE3D27D4EB4F) & _MASK64


def _storage_int(t: pa.DataType) -> pa.DataType:
    return pa.int32() if (pa.types.is_date32(t) or pa.types.is_time32(t)) else pa.int64()


def batch_checksum(batch: pa.RecordBatch) -> int:
    """Checksum contribution of one record batch (add contributions modulo 2**64)."""
    total: int = batch.num_rows
    for i, col in enumerate(batch.columns):
        total += (_column_sum(col) * (2 * i + 3)) & _MASK64
    return total & _MASK64


def combine(a: int, b: int) -> int:
    """Add two checksum contributions (order-independent)."""
    return (a + b) & _MASK64


def finish(total: int) -> int:
    """Fold a 64-bit total into a non-negative value that fits Int64 and UInt64 columns."""
    return (total ^ (total >> 63)) & _MASK63


def arrow_checksum(batches: Iterable[pa.RecordBatch]) -> int:
    """The checksum of all rows of ``batches`` (independent of the batch boundaries)."""
    total = 0
    for b in batches:
        total = combine(total, batch_checksum(b))
    return finish(total)


class CountingBatches:
    """Wrap a batch iterator: count rows and fold the checksum as batches stream by.

    Runs on the executor; sees each batch once, holds none of them.
    """

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self._it = iter(batches)
        self.rows = 0
        self._total = 0

    def __iter__(self) -> "CountingBatches":
        return self

    def __next__(self) -> pa.RecordBatch:
        b = next(self._it)
        self.rows += b.num_rows
        self._total = combine(self._total, batch_checksum(b))
        return b

    @property
    def checksum(self) -> int:
        return finish(self._total)


def marker_exists(markers: CommitMarkers, xid: str) -> bool:
    """True if ``xid`` has a committed marker."""
    return markers.lookup(xid) is not None


__all__ = [
    "MARKERS_TABLE",
    "CommitMarkers",
    "CountingBatches",
    "arrow_checksum",
    "batch_checksum",
    "READ_COMMITTED",
    "marker_exists",
    "transactions_unsupported",
]
