"""What every commit mode shares: clients, schema validation, building a Prepared."""

from __future__ import annotations

import dataclasses
from typing import Iterator, Mapping, Sequence

import pyarrow as pa

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP, safe_url
from clickhouse_tx.conversion.checksum import CountingBatches
from clickhouse_tx.conversion.schema import TableInfo, check_schema, describe_table, refuse_read_only_replica
from clickhouse_tx.errors import ConfigurationError, ServerError
from clickhouse_tx.interfaces import Hook, Mode, Prepared, Target, WriteContext
from clickhouse_tx.modes.views import DependentView, dependent_views, describe_views
from clickhouse_tx.store.markers import CommitMarkers

#: What keeps a target's materialized views exactly once, for the refusals' messages.
VIEW_MODES = (
    "modes that keep them exactly once: 'transaction' and 'staging' (every view's table a "
    "non-replicated *MergeTree, a server that runs transactions), 'dedup' (every view's table "
    "a *MergeTree with a deduplication window); see docs/modes.md, 'Materialized views'"
)


def distributed_hint(info: TableInfo) -> str:
    """What to say after a mode's refusal of a ``Distributed`` target ("" for any other engine).

    An INSERT into a Distributed table is forwarded to the shards later, by the server,
    outside anything a mode can commit, roll back or deduplicate: no mode is exactly
    once through it, so the writer addresses the shards' own tables instead."""
    if not info.engine.startswith("Distributed"):
        return ""
    return (
        ". A Distributed table forwards rows to its shards outside any commit: write into the local "
        "table of each shard with the option shards (docs/deployment.md, 'ClickHouse clusters')"
    )


class ModeBase:
    """Plain, stateless and picklable: every method builds the clients it needs."""

    mode: Mode

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other)

    def __hash__(self) -> int:
        return hash(type(self))

    # -- helpers -----------------------------------------------------------------------
    @staticmethod
    def client(target: Target, session_id: str | None = None, session_timeout: int | None = None) -> ClickHouseHTTP:
        return ClickHouseHTTP(target, session_id=session_id, session_timeout=session_timeout)

    @staticmethod
    def target_sql(target: Target) -> str:
        return q.qualified(target.database, target.table)

    @staticmethod
    def display(target: Target) -> str:
        return f"{target.database}.{target.table}"

    def check_layout(self, target: Target, batch: int, messages: Sequence[Prepared]) -> None:
        """Nothing to check: the mode's rows stay invisible until the commit (dedup overrides)."""

    def commit_together(self, target: Target, ps: Sequence[Prepared], before_commit: Hook | None = None) -> None:
        """Nothing to do: each xid commits on its own (staging with ``visibility=batch`` overrides)."""

    def renew(self, target: Target, p: Prepared) -> bool:
        """True, nothing sent: this mode's prepared work has no session to expire and
        stays until rolled back (transaction overrides)."""
        return True

    def require_transactions(self, target: Target, needed_by: str, instead: str = "") -> None:
        """Driver, once per query: the server must run ``BEGIN TRANSACTION``; else ConfigurationError."""
        # A query in an implicit transaction, not BEGIN in a session: it holds nothing
        # once answered, so a lost reply leaves no open transaction behind (a session's
        # BEGIN whose reply was lost stayed RUNNING until the session expired) and the
        # probe can be repeated like any read.
        probe = self.client(target)
        try:
            probe.command("SELECT 1", settings={"implicit_transaction": 1}, idempotent=True)
        except ServerError as e:
            raise ConfigurationError(
                f"the server at {probe.server} refused a transaction ({e.message}): {needed_by} "
                "needs allow_experimental_transactions and Keeper, see "
                f"server_patches/config.d/transactions.xml{'; ' + instead if instead else ''}",
                code=e.code,
                name=e.name,
            ) from None
        finally:
            probe.close()

    def views_error(self, target: Target, views: Sequence[DependentView], why: str) -> ConfigurationError:
        """The refusal of a write into ``target`` whose ``views`` this mode cannot keep exactly once."""
        return ConfigurationError(
            f"table {self.display(target)} has materialized views ({describe_views(views)}) that "
            f"mode {self.mode.value!r} cannot keep exactly once: {why}; nothing was written. The {VIEW_MODES}"
        )

    def view_tables(self, target: Target, views: Sequence[DependentView]) -> list[TableInfo]:
        """Driver: the table of each view (once each); refuses a view whose table the server does not name."""
        unknown = [v for v in views if v.target is None]
        if unknown:
            raise self.views_error(target, unknown, "the server does not say which table they write into")
        out: dict[tuple[str, str], TableInfo] = {}
        with self.client(target) as c:
            for v in views:
                assert v.target is not None
                if v.target not in out:
                    out[v.target] = describe_table(c, *v.target)
        return list(out.values())

    def transactional_views(self, target: Target, needed_by: str) -> list[DependentView]:
        """Driver, once per query: the target's views, each writing into a table a transaction can hold.

        The views' inserts run inside the transaction that writes the target's rows, and
        ClickHouse transactions hold non-replicated ``*MergeTree`` tables only: a view
        into any other table would fail every task's insert, so it is refused here.
        """
        views = dependent_views(target)
        infos = self.view_tables(target, views)
        bad = {(i.database, i.table): i.engine for i in infos if i.is_replicated or not i.is_merge_tree}
        if bad:
            shown = [v for v in views if v.target in bad]
            engines = ", ".join(f"{d}.{t} is {e}" for (d, t), e in bad.items())
            raise self.views_error(
                target,
                shown,
                f"{needed_by} writes their rows in a ClickHouse transaction, which holds "
                f"non-replicated *MergeTree tables only ({engines})",
            )
        return views

    def described(self, target: Target, schema: pa.Schema, info: TableInfo | None) -> TableInfo:
        """Driver: ``info`` when the caller read and checked it already, else :meth:`describe_and_check`."""
        return info if info is not None else self.describe_and_check(target, schema)

    def describe_and_check(self, target: Target, schema: pa.Schema) -> TableInfo:
        """Driver: the table must exist and accept ``schema``; raise ConfigurationError."""
        with self.client(target) as c:
            info = describe_table(c, target.database, target.table)
            check_schema(info, schema)
            return info

    def refuse_read_only(self, target: Target, info: TableInfo) -> None:
        """Driver, once per query, the last check before any DDL: a replicated target whose
        replica is read-only on this server is refused (ServerBusyError, TABLE_IS_READ_ONLY).

        Last, so that what can never work (an engine, a window, a view) is said first:
        this refusal only says when to try again."""
        with self.client(target) as c:
            refuse_read_only_replica(c, info)

    def prepared(
        self,
        target: Target,
        ctx: WriteContext,
        xid: str,
        rows: int,
        checksum: int,
        details: Mapping[str, object] | None = None,
    ) -> Prepared:
        attempt = Prepared.for_attempt(ctx, xid, self.mode, safe_url(target.url), self.display(target))
        return dataclasses.replace(attempt, rows=rows, checksum=checksum, details=dict(details or {}))

    def prepared_counted(
        self, target: Target, ctx: WriteContext, xid: str, counted: CountingBatches, details: Mapping[str, object]
    ) -> Prepared:
        """:meth:`prepared` with the rows and checksum of what ``counted`` passed on."""
        return self.prepared(target, ctx, xid, counted.rows, counted.checksum, details)

    @staticmethod
    def markers(target: Target, client: ClickHouseHTTP | None = None) -> CommitMarkers:
        return CommitMarkers(target, client)


def peek_schema(batches: Iterator[pa.RecordBatch]) -> tuple[pa.Schema | None, Iterator[pa.RecordBatch]]:
    """The schema of the first batch and an iterator that still yields every batch.

    ``(None, empty)`` when there is no batch at all (an empty partition).
    """
    it = iter(batches)
    for first in it:

        def chained(first: pa.RecordBatch = first) -> Iterator[pa.RecordBatch]:
            yield first
            yield from it

        return first.schema, chained()
    return None, iter(())
