"""Which privileges a commit mode needs, and which of them the connecting user lacks.

Runs in ``python -m clickhouse_tx check`` (:mod:`clickhouse_tx.admin.preflight`), before
the first write: the driver itself does not read grants (a missing one fails the first
statement that needs it, often on an executor mid-batch). The privileges are read from
``system.grants`` (the user's and its enabled roles') and judged against the server's
own privilege tree (``system.privileges``), so ``GRANT ALL`` or ``GRANT ALTER`` cover
``ALTER MOVE PARTITION`` as the server would. Partial revokes are honoured; what the
server decides at run time (grants changed meanwhile) is not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.interfaces import Mode, Target
from clickhouse_tx.store.markers import MARKERS_TABLE
from clickhouse_tx.store.registry import DEFAULT_TABLE as REGISTRY_TABLE

_GRANTS_SQL = (
    "SELECT toString(access_type) AS access_type, database, table, column, is_partial_revoke, is_wildcard "
    "FROM system.grants WHERE user_name = currentUser() "
    "OR role_name IN (SELECT role_name FROM system.enabled_roles)"
)
_TREE_SQL = "SELECT toString(privilege) AS privilege, toString(parent_group) AS parent FROM system.privileges"


@dataclasses.dataclass(frozen=True)
class Need:
    """One privilege on ``database.table``; ``table`` None: on every table of the database
    (the names of stage and bookkeeping tables are not known in advance)."""

    privilege: str
    database: str
    table: str | None = None

    def __str__(self) -> str:
        return f"{self.privilege} ON {_object(self.database, self.table)}"


@dataclasses.dataclass(frozen=True)
class Grant:
    """One row of ``system.grants`` (None: any database, any table, every column)."""

    access_type: str
    database: str | None = None
    table: str | None = None
    column: str | None = None
    is_partial_revoke: bool = False
    is_wildcard: bool = False


def needed(mode: Mode, target: Target) -> list[Need]:
    """The privileges mode ``mode`` needs to write into ``target`` (pure).

    Every mode inserts into the target. Every mode but ``none`` creates and writes its
    bookkeeping tables in the target's database (markers, claims, job rows: ``CREATE
    TABLE``, ``INSERT``, ``SELECT`` on the database) and moves registry entries by
    ``ALTER ... UPDATE`` and forgets them by ``ALTER ... DELETE``. ``staging`` creates a
    stage per partition attempt beside the target, comments it, moves its partitions
    into the target and drops it.
    """
    db, table = target.database, target.table
    out = [Need("INSERT", db, table), Need("SELECT", db, table)]
    if mode is Mode.NONE:
        return out
    out += [Need(p, db) for p in ("CREATE TABLE", "INSERT", "SELECT")]
    out += [Need(p, db, REGISTRY_TABLE) for p in ("ALTER UPDATE", "ALTER DELETE")]
    out.append(Need("SELECT", db, MARKERS_TABLE))
    if mode is Mode.STAGING:
        out += [Need(p, db) for p in ("ALTER MOVE PARTITION", "ALTER MODIFY COMMENT", "DROP TABLE")]
    return out


def _ancestors(privilege: str, parents: Mapping[str, str | None]) -> set[str]:
    """``privilege`` and every group above it in the server's tree (``ALL`` included)."""
    out = {privilege, "ALL"}
    seen = privilege
    while (up := parents.get(seen)) and up not in out:
        out.add(up)
        seen = up
    return out


def _in_scope(name: str | None, wanted: str | None, wildcard: bool) -> bool:
    """A grant's database or table (None: all) covers ``wanted`` (None: all of them)."""
    if name is None:
        return True
    if wanted is None:
        return False
    return wanted.startswith(name) if wildcard else wanted == name


def _covers(g: Grant, need: Need, kinds: set[str]) -> bool:
    return (
        g.access_type in kinds
        and g.column is None
        and _in_scope(g.database, need.database, g.is_wildcard and g.table is None)
        and _in_scope(g.table, need.table, g.is_wildcard)
    )


def _revokes(g: Grant, need: Need, kinds: set[str]) -> bool:
    """A partial revoke of any part of what ``need`` asks for."""
    same_db = g.database is None or g.database == need.database
    same_table = g.table is None or need.table is None or g.table == need.table
    return g.access_type in kinds and same_db and same_table


def missing(needs: Sequence[Need], grants: Iterable[Grant], parents: Mapping[str, str | None]) -> list[Need]:
    """The ``needs`` no grant covers, or a partial revoke takes back (pure).

    ``parents`` is the server's privilege tree, privilege -> the group holding it.
    """
    rows = list(grants)
    out = []
    for need in needs:
        kinds = _ancestors(need.privilege, parents)
        given = any(_covers(g, need, kinds) for g in rows if not g.is_partial_revoke)
        taken = any(_revokes(g, need, kinds) for g in rows if g.is_partial_revoke)
        if not given or taken:
            out.append(need)
    return out


def read_grants(client: ClickHouseHTTP) -> tuple[list[Grant], dict[str, str | None]]:
    """The connecting user's grants (with its enabled roles') and the server's privilege tree."""
    rows = client.query_json(_GRANTS_SQL)
    grants = [
        Grant(
            str(r["access_type"]),
            r["database"],
            r["table"],
            r["column"],
            bool(int(r["is_partial_revoke"])),
            bool(int(r.get("is_wildcard") or 0)),
        )
        for r in rows
    ]
    tree = {str(r["privilege"]): (str(r["parent"]) if r["parent"] else None) for r in client.query_json(_TREE_SQL)}
    return grants, tree


def _object(database: str, table: str | None) -> str:
    return f"{q.quote_identifier(database)}.{'*' if table is None else q.quote_identifier(table)}"


def grant_statement(lacking: Sequence[Need], user: str) -> str:
    """The ``GRANT`` statements that give ``user`` what it lacks, one per object."""
    by_object: dict[tuple[str, str | None], list[str]] = {}
    for n in lacking:
        by_object.setdefault((n.database, n.table), []).append(n.privilege)
    return "; ".join(
        f"GRANT {', '.join(privs)} ON {_object(db, t)} TO {q.quote_identifier(user)}"
        for (db, t), privs in by_object.items()
    )


__all__ = ["Grant", "Need", "grant_statement", "missing", "needed", "read_grants"]
