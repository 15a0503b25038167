"""The verifier's read-only access to ClickHouse (:class:`ClickHouseReader`).

Held apart from :mod:`clickhouse_tx.verify.verifier` so the checks it runs
(:mod:`clickhouse_tx.verify.offsets`, :mod:`clickhouse_tx.verify.audit`) can name the
reader without importing the module that runs them.
"""

from __future__ import annotations

from typing import Any, Mapping

from clickhouse_tx.client.http import ClickHouseHTTP, safe_url
from clickhouse_tx.interfaces import DEFAULT_TLS, Target, TlsSettings
from clickhouse_tx.store.markers import CommittedReader


class ClickHouseReader:
    """Read-only access for the verifier: JSON rows, query parameters, read-committed reads.

    A thin layer on the project's one client (:class:`clickhouse_tx.client.http.ClickHouseHTTP`):
    the same authentication, parameter formatting and error mapping as the writer.
    The password is sent as a header and never appears in ``repr`` or errors.
    """

    def __init__(
        self,
        url: str,
        *,
        user: str = "default",
        password: str = "",
        timeout_s: float = 300.0,
        tls: TlsSettings = DEFAULT_TLS,
    ) -> None:
        self.url = safe_url(url.rstrip("/"))
        self.user = user
        self.client = ClickHouseHTTP(
            Target(url=url, database="", table="", user=user, password=password, request_timeout_s=timeout_s, tls=tls)
        )
        self._committed = CommittedReader(self.client)

    def __repr__(self) -> str:
        return f"ClickHouseReader(url={self.url!r}, user={self.user!r})"

    def close(self) -> None:
        self.client.close()

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
        return self.client.query_json(sql, params=params)

    def columns(self, database: str, table: str) -> dict[str, str]:
        """Column name → type of ``database.table`` (empty if the table does not exist)."""
        out = self.rows(
            "SELECT name, type FROM system.columns WHERE database = {d:String} "
            "AND table = {t:String} ORDER BY position",
            {"d": database, "t": table},
            committed=False,
        )
        return {r["name"]: r["type"] for r in out}
