"""Describe a target table and check an Arrow schema against it, before any write.

:func:`describe_table` reads ``system.tables`` (engine, DDL), ``system.columns``
(names, types, default kinds) and the deduplication window; :func:`check_schema`
compares the Arrow schema of the data with it and raises
:class:`~clickhouse_tx.errors.ConfigurationError` naming the table, the column and
both types. Runs on the driver, once per query, from each mode's ``validate``.

The check refuses only what can never fit (a kind no value of which converts, a
column the table lacks or cannot take); whether each value fits (range, sign,
precision, nulls, length, membership) is checked on the executors by
:class:`clickhouse_tx.conversion.convert.ConversionPlan`, so ClickHouse never converts silently.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Iterable, Mapping

import pyarrow as pa

from clickhouse_tx.client.codes import TABLE_IS_READ_ONLY
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.conversion.chtypes import parse_clickhouse_type, strip_wrappers
from clickhouse_tx.errors import ConfigurationError, ServerBusyError

_WINDOW_RE = re.compile(r"\bnon_replicated_deduplication_window\s*=\s*(\d+)")
_REPL_WINDOW_RE = re.compile(r"\breplicated_deduplication_window\s*=\s*(\d+)")


@dataclasses.dataclass(frozen=True)
class Column:
    name: str
    type: str
    default_kind: str = ""  # "", DEFAULT, MATERIALIZED, ALIAS, EPHEMERAL


@dataclasses.dataclass(frozen=True)
class TableInfo:
    """What the modes need to know about a target table, read by :func:`describe_table`.

    The dedup windows are the table's own settings, else the server's MergeTree defaults.
    ``engine_full`` and ``uuid`` are what a stage ``AS`` the table is made from
    (:func:`clickhouse_tx.modes.staging.tables.create_stage_table`).
    """

    database: str
    table: str
    engine: str
    columns: tuple[Column, ...]
    create_query: str
    non_replicated_dedup_window: int
    replicated_dedup_window: int
    engine_full: str = ""
    uuid: str = ""

    @property
    def display(self) -> str:
        return f"{self.database}.{self.table}"

    @property
    def is_merge_tree(self) -> bool:
        return self.engine.endswith("MergeTree")

    @property
    def is_replicated(self) -> bool:
        return self.engine.startswith(("Replicated", "Shared"))

    def column(self, name: str) -> Column | None:
        return next((c for c in self.columns if c.name == name), None)


def describe_table(client: ClickHouseHTTP, database: str, table: str) -> TableInfo:
    """Read engine, columns and dedup windows of ``database.table``.

    Raises
    ------
    ConfigurationError
        The table (or database) does not exist.
    """
    rows = client.query_json(
        "SELECT engine, create_table_query, engine_full, toString(uuid) AS uuid FROM system.tables "
        "WHERE database = {d:String} AND name = {t:String}",
        params={"d": database, "t": table},
    )
    if not rows:
        raise ConfigurationError(
            f"table {database}.{table} does not exist on {client.server}: create it first (or check the table option)"
        )
    engine = str(rows[0]["engine"])
    ddl = str(rows[0]["create_table_query"])
    cols = client.query_json(
        "SELECT name, type, default_kind FROM system.columns "
        "WHERE database = {d:String} AND table = {t:String} ORDER BY position",
        params={"d": database, "t": table},
    )
    defaults = {
        r["name"]: int(r["value"])
        for r in client.query_json(
            "SELECT name, value FROM system.merge_tree_settings WHERE name IN "
            "('non_replicated_deduplication_window', 'replicated_deduplication_window')"
        )
    }
    m = _WINDOW_RE.search(ddl)
    window = int(m.group(1)) if m else defaults.get("non_replicated_deduplication_window", 0)
    m = _REPL_WINDOW_RE.search(ddl.replace("non_replicated_deduplication_window", "_"))
    rwindow = int(m.group(1)) if m else defaults.get("replicated_deduplication_window", 0)
    return TableInfo(
        database,
        table,
        engine,
        tuple(Column(str(c["name"]), str(c["type"]), str(c.get("default_kind") or "")) for c in cols),
        ddl,
        window,
        rwindow,
        str(rows[0]["engine_full"]),
        str(rows[0]["uuid"]),
    )


def refuse_read_only_replica(client: ClickHouseHTTP, info: TableInfo) -> None:
    """Driver, once per query: a replicated table whose replica on this server is read-only is refused.

    ClickHouse turns a replica read-only while it has no Keeper session (lost, expired,
    never made). Every INSERT, MOVE or ALTER into it then fails with
    ``TABLE_IS_READ_ONLY``, after the server has retried for up to minutes
    (``insert_keeper_max_retries``); refusing here says so at once, before any task writes.

    Raises
    ------
    ServerBusyError
        Code ``TABLE_IS_READ_ONLY`` (242): nothing was written; trying again once the
        replica has its Keeper session back may work.
    """
    if not info.is_replicated:
        return
    rows = client.query_json(
        "SELECT is_readonly, zookeeper_path, replica_name FROM system.replicas "
        "WHERE database = {d:String} AND table = {t:String}",
        params={"d": info.database, "t": info.table},
    )
    if rows and int(rows[0]["is_readonly"]):
        raise ServerBusyError(
            f"table {info.display} on {client.server} is a read-only replica (replica {rows[0]['replica_name']} "
            f"at {rows[0]['zookeeper_path']}): ClickHouse refuses every write into it until the replica has a "
            "Keeper session again; nothing was written",
            code=TABLE_IS_READ_ONLY,
            name="TABLE_IS_READ_ONLY",
        )


# ---------------------------------------------------------------------- the check


def check_schema(
    info: TableInfo, schema: pa.Schema, *, exclude: Iterable[str] = (), source_types: Mapping[str, str] | None = None
) -> None:
    """Raise ConfigurationError unless every data column *can* go into the table.

    Driver, once per query (each mode's ``validate``), before any task writes. It
    refuses only what can never fit: a column the table lacks (with close matches),
    an ``ALIAS``/``MATERIALIZED`` target, a table column that would be silently
    filled (no data, no ``DEFAULT``, not ``Nullable``), and a kind no value of which
    converts (a string into ``Int32``, an array into a scalar, see
    :func:`clickhouse_tx.conversion.column_fit.fit_problem`). Everything else (signedness, width,
    range, precision, nulls) is checked value by value on the executors by
    :class:`clickhouse_tx.conversion.convert.ConversionPlan`.

    Parameters
    ----------
    info
        The table, from :func:`describe_table`.
    schema
        The Arrow schema of the data.
    exclude
        Data columns that are not inserted (the routing column).
    source_types
        Optional display names of the data types (e.g. Spark's) for messages.
    """
    from clickhouse_tx.conversion.column_fit import fit_problem

    excluded = set(exclude)
    fields = [f for f in schema if f.name not in excluded]
    if not fields:
        raise ConfigurationError(f"the data has no columns to insert into {info.display}")
    problems: list[str] = []
    seen: set[str] = set()
    for f in fields:
        if f.name in seen:
            problems.append(f"data column `{f.name}` appears twice")
            continue
        seen.add(f.name)
        col = info.column(f.name)
        problem = _column_problem(info, f, col, (source_types or {}).get(f.name))
        if problem is None and col is not None:
            why = fit_problem(f.type, parse_clickhouse_type(col.type))
            if why:
                shown = (source_types or {}).get(f.name) or f"Arrow {f.type}"
                problem = (
                    f"column `{f.name}`: {shown} can never go into ClickHouse type {col.type} of {info.display} ({why})"
                )
        if problem:
            problems.append(problem)
    for c in info.columns:
        if c.name in seen or c.default_kind:
            continue
        if not strip_wrappers(parse_clickhouse_type(c.type))[1]:
            problems.append(
                f"column `{c.name}` of {info.display} ({c.type}) has no data, no DEFAULT "
                "and is not Nullable: it would be silently filled with a default value"
            )
    if problems:
        raise ConfigurationError(f"schema does not fit {info.display}:\n  - " + "\n  - ".join(problems))


def _column_problem(info: TableInfo, f: pa.Field, col: Column | None, shown: str | None) -> str | None:
    """A data column the table lacks or cannot take at all (None: its values decide)."""
    if col is None:
        names = [c.name for c in info.columns]
        close = [n for n in names if n.lower() == f.name.lower()] or difflib.get_close_matches(f.name, names, n=3)
        hint = f" (did you mean {', '.join(f'`{c}`' for c in close)}?)" if close else ""
        return f"data column `{f.name}` ({shown or f.type}) is not a column of {info.display}{hint}"
    if col.default_kind.upper() in ("MATERIALIZED", "ALIAS"):
        return (
            f"column `{f.name}` of {info.display} is {col.default_kind.upper()} ({col.type}): "
            "it cannot be inserted into; drop it from the data"
        )
    return None


def conversion_columns(info: TableInfo, schema: pa.Schema, exclude: Iterable[str] = ()) -> tuple[tuple[str, str], ...]:
    """``(name, ClickHouse type)`` of each data column, for a :class:`~clickhouse_tx.conversion.convert.ConversionPlan`.

    Driver, once per query, after :func:`check_schema` passed.
    """
    excluded = set(exclude)
    return tuple(
        (f.name, col.type) for f in schema if f.name not in excluded and (col := info.column(f.name)) is not None
    )
