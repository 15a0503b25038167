"""The materialized views that an insert into a target table runs, found on the driver.

ClickHouse runs every ``MATERIALIZED VIEW`` whose ``SELECT`` reads a table on each
block inserted into that table, and writes its result into the view's table (its
``TO`` table, or its ``.inner`` table); a view on that table runs in turn, so an insert
into the target reaches a chain ``target -> MV1 -> t1 -> MV2 -> t2``. What each mode
keeps of those views (once, at least once, or a refusal) is in ``docs/modes.md``,
"Materialized views on the target".

:func:`dependent_views` reads ``system.tables``: ``dependencies_database`` /
``dependencies_table`` of a table list the views that read it, and
``target_database`` / ``target_table`` of a view name the table it writes into (on
servers without those two columns, the ``TO`` clause of ``create_table_query``, or the
``.inner_id.<uuid>`` / ``.inner.<name>`` table). Runs on the driver before any task
writes (each mode's ``validate``), and in ``verify``; one or two small reads per table
of the chain.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

from clickhouse_tx.client.http import ClickHouseHTTP, reuse_or_open
from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.interfaces import Target

#: A view chain longer than this is refused as a cycle (ClickHouse forbids cycles, but a
#: view re-created under a changing name could still make discovery run on).
MAX_VIEWS = 1000

_NAME = r"(?:`(?:[^`\\]|\\.)*`|\"(?:[^\"\\]|\\.)*\"|[A-Za-z_][A-Za-z0-9_]*)"
_TO_RE = re.compile(rf"^CREATE MATERIALIZED VIEW\s+{_NAME}(?:\.{_NAME})?\s+TO\s+({_NAME})(?:\.({_NAME}))?", re.I)


@dataclasses.dataclass(frozen=True)
class DependentView:
    """One materialized view an insert into the target runs (directly or down a chain).

    ``view``: the view's (database, name); ``source``: the table it reads (the target,
    or the table of a view before it in the chain); ``target``: the table it writes into
    (its ``TO`` table or its inner table), None if the server does not say.
    """

    view: tuple[str, str]
    source: tuple[str, str]
    target: tuple[str, str] | None

    @property
    def display(self) -> str:
        """``db.view -> db.table`` for messages."""
        into = f"{self.target[0]}.{self.target[1]}" if self.target else "(unknown table)"
        return f"{self.view[0]}.{self.view[1]} -> {into}"


def dependent_views(target: Target, client: ClickHouseHTTP | None = None) -> list[DependentView]:
    """Every materialized view an insert into ``target`` runs, recursively, in dependency order.

    Driver (each mode's ``validate``, once per batch job or streaming commit; a batch
    job's plan) and ``verify``. A view comes after the view whose table it reads
    (breadth first from the target); a view reached twice (two views into one table)
    is listed once.

    A target that does not exist has no views (the mode's table check names it).

    Parameters
    ----------
    target
        The table an insert goes into.
    client
        A session-less client to read through (the caller's, left open); None: one of
        ``target``'s, closed after.

    Raises
    ------
    ConfigurationError
        More than :data:`MAX_VIEWS` views (a cycle).
    """
    with reuse_or_open(target, client) as c:
        out: list[DependentView] = []
        seen: set[tuple[str, str]] = set()
        todo: list[tuple[str, str]] = [(target.database, target.table)]
        visited: set[tuple[str, str]] = set()
        while todo:
            source = todo.pop(0)
            if source in visited:
                continue
            visited.add(source)
            for view in _views_reading(c, source):
                if view.view in seen:
                    continue
                seen.add(view.view)
                out.append(view)
                if view.target is not None:
                    todo.append(view.target)
                if len(out) > MAX_VIEWS:
                    raise ConfigurationError(
                        f"more than {MAX_VIEWS} materialized views depend on {target.database}.{target.table}"
                    )
        return out


def _views_reading(c: ClickHouseHTTP, source: tuple[str, str]) -> list[DependentView]:
    """The materialized views that read ``source`` directly (one or two reads)."""
    rows = c.query_json(
        "SELECT arrayZip(dependencies_database, dependencies_table) AS deps FROM system.tables "
        "WHERE database = {d:String} AND name = {t:String}",
        params={"d": source[0], "t": source[1]},
    )
    deps = [(str(d), str(t)) for row in rows for d, t in row["deps"]]
    if not deps:
        return []
    described = c.query_json(
        "SELECT database, name, uuid, create_table_query AS ddl, "
        + _target_columns(c)
        + " FROM system.tables WHERE engine = 'MaterializedView' "
        "AND database IN {dbs:Array(String)} AND name IN {names:Array(String)}",
        params={"dbs": sorted({d for d, _ in deps}), "names": sorted({t for _, t in deps})},
    )
    by_name = {(str(r["database"]), str(r["name"])): r for r in described}
    views = []
    for dep in deps:  # the server's order of the dependencies
        r = by_name.get(dep)
        if r is not None:
            views.append(DependentView(dep, source, _view_target(r)))
    return views


def _target_columns(c: ClickHouseHTTP) -> str:
    """``target_database, target_table`` where ``system.tables`` has them, else empty strings."""
    rows = c.query_json(
        "SELECT count() AS n FROM system.columns WHERE database = 'system' AND table = 'tables' "
        "AND name IN ('target_database', 'target_table')"
    )
    if rows and int(rows[0]["n"]) == 2:
        return "target_database, target_table"
    return "'' AS target_database, '' AS target_table"


def _view_target(row: dict[str, object]) -> tuple[str, str] | None:
    """The table a view writes into: the server's columns, else its DDL (see the module doc)."""
    db, table = str(row.get("target_database") or ""), str(row.get("target_table") or "")
    if db and table:
        return db, table
    return view_target_from_ddl(str(row["database"]), str(row["name"]), str(row["uuid"]), str(row["ddl"]))


def view_target_from_ddl(database: str, name: str, uuid: str, ddl: str) -> tuple[str, str] | None:
    """The table a materialized view writes into, from its ``CREATE`` statement (pure).

    ``TO db.table`` (or ``TO table``: the view's database), else the inner table:
    ``.inner_id.<uuid>`` in an Atomic database, ``.inner.<name>`` in an Ordinary one
    (``uuid`` all zeros).
    """
    m = _TO_RE.match(ddl.strip())
    if m:
        first, second = m.groups()
        return (_unquote(first), _unquote(second)) if second else (database, _unquote(first))
    if not ddl.strip().upper().startswith("CREATE MATERIALIZED VIEW"):
        return None
    if uuid and uuid.strip("0-"):
        return database, f".inner_id.{uuid}"
    return database, f".inner.{name}"


def _unquote(name: str) -> str:
    if len(name) >= 2 and name[0] == name[-1] and name[0] in '`"':
        return re.sub(r"\\(.)", r"\1", name[1:-1])
    return name


def describe_views(views: Sequence[DependentView]) -> str:
    """The views as ``db.mv -> db.table, ...`` for an error message."""
    return ", ".join(v.display for v in views)


def view_tables(views: Sequence[DependentView]) -> list[tuple[str, str]]:
    """The distinct tables the views write into, in the views' order."""
    out: list[tuple[str, str]] = []
    for v in views:
        if v.target is not None and v.target not in out:
            out.append(v.target)
    return out


__all__ = [
    "DependentView",
    "dependent_views",
    "describe_views",
    "view_tables",
    "view_target_from_ddl",
]
