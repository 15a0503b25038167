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
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.codes import TABLE_ALREADY_EXISTS, UNKNOWN_TABLE, transactions_unsupported
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.errors import ServerError
from clickhouse_tx.interfaces import Prepared, Target

MARKERS_TABLE = "clickhouse_tx_commits"
_MASK64 = (1 << 64) - 1

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
#: The columns a marker's INSERT gives (all but ``committed_at``, the server's clock).
_GIVEN_STRUCTURE = q.quote_string(", ".join(f"{q.quote_identifier(c)} {t}" for c, t in _COLUMNS[:-1]))
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
        ddl = q.record_table_ddl(self.fq, _COLUMNS, ("txn_id", "batch", "partition", "xid"))
        try:
            self.client.command(ddl, idempotent=True)
        except ServerError as e:
            if e.code != TABLE_ALREADY_EXISTS:
                raise
        _CREATED.add(key)

    def insert_sql(self, p: Prepared, *more: Prepared) -> str:
        """The ``INSERT`` of the markers of ``p`` (and ``more``), one statement (any client/session).

        The rows go through ``format(Values, ...)`` with the server's ``now64(3)`` added
        once per block. In a plain ``VALUES`` list that call makes the server evaluate
        every row as an expression; 128 markers took a median 42 ms that way and 13 ms
        this way (``python -m benchmarks.stage_moves``, the embedded server).
        """
        rows = ", ".join(f"({', '.join(self._values(x))})" for x in (p, *more))
        return (
            f"INSERT INTO {self.fq} ({_SELECT}) SELECT *, now64(3) "
            f"FROM format(Values, {_GIVEN_STRUCTURE}, {q.quote_string(rows)})"
        )

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

    # ------------------------------------------------------------------ the audit's reads

    def columns(self) -> dict[str, str]:
        """Column name -> type of the markers table; empty when it does not exist.

        A markers table written before markers named their target has no ``table``
        column; the audit's reads then take every marker of the database.
        """
        rows = self.client.query_json(
            "SELECT name, type FROM system.columns WHERE database = {d:String} "
            "AND table = {t:String} ORDER BY position",
            params={"d": self.target.database, "t": MARKERS_TABLE},
        )
        return {r["name"]: r["type"] for r in rows}

    def totals(self, tables: Sequence[str], txn_id: str | None = None) -> dict[str, int]:
        """``markers``, ``rows`` and ``txn_ids`` of the committed markers of ``tables``
        (the names a target is recorded under; empty: any) and ``txn_id`` (None: any)."""
        where, params = self._audit_filter(tables, txn_id)
        row = self._read(
            f"SELECT count() AS markers, sum(`rows`) AS rows, uniqExact(txn_id) AS txns FROM {self.fq}{where}", params
        )[0]
        return {"markers": int(row["markers"]), "rows": int(row["rows"] or 0), "txn_ids": int(row["txns"])}

    def double_commits(
        self, tables: Sequence[str], txn_id: str | None = None, limit: int = 1000
    ) -> Sequence[dict[str, Any]]:
        """Each (txn_id, batch, partition) committed under more than one xid: ``txn_id``,
        ``batch``, ``p`` (the partition) and ``xids``, at most ``limit`` of them."""
        where, params = self._audit_filter(tables, txn_id)
        return self._read(
            f"SELECT txn_id, batch, `partition` AS p, groupArray(xid) AS xids FROM {self.fq}{where} "
            f"GROUP BY txn_id, batch, p HAVING count() > 1 ORDER BY txn_id, batch, p LIMIT {int(limit)}",
            params,
        )

    def committed_xids(self, txn_id: str) -> set[str]:
        """Every xid of ``txn_id`` with a committed marker."""
        return {r["xid"] for r in self._read(f"SELECT xid FROM {self.fq} WHERE txn_id = {{tx:String}}", {"tx": txn_id})}

    @staticmethod
    def _audit_filter(tables: Sequence[str], txn_id: str | None) -> tuple[str, dict[str, object]]:
        conds: list[str] = []
        params: dict[str, object] = {}
        if tables:
            conds.append("(" + " OR ".join(f"`table` = {{mt{i}:String}}" for i in range(len(tables))) + ")")
            params.update({f"mt{i}": name for i, name in enumerate(tables)})
        if txn_id:
            conds.append("txn_id = {mt_txn:String}")
            params["mt_txn"] = txn_id
        return (" WHERE " + " AND ".join(conds)) if conds else "", params


__all__ = ["MARKERS_TABLE", "READ_COMMITTED", "CommitMarkers", "CommittedReader"]
