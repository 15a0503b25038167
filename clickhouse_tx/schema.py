"""Describe a target table and check an Arrow schema against it, before any write.

:func:`describe_table` reads ``system.tables`` (engine, DDL), ``system.columns``
(names, types, default kinds) and the deduplication window; :func:`check_schema`
compares the Arrow schema of the data with it and raises
:class:`~clickhouse_tx.errors.ConfigurationError` naming the table, the column and
both types. Runs on the driver, once per query, from each mode's ``validate``.

What counts as insertable: ClickHouse converts a lot on ``INSERT ... FORMAT
ArrowStream`` (ints into any int width, strings into UUID, enums, dates, ...).
We accept what it converts by design and refuse what fails or silently loses
meaning: a nested value into a scalar column or the reverse, floats into integers,
strings into numbers, anything into a column that cannot be inserted into
(``MATERIALIZED``, ``ALIAS``).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping

import pyarrow as pa

from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.http_client import ClickHouseHTTP

_WINDOW_RE = re.compile(r"\bnon_replicated_deduplication_window\s*=\s*(\d+)")
_REPL_WINDOW_RE = re.compile(r"\breplicated_deduplication_window\s*=\s*(\d+)")


@dataclasses.dataclass(frozen=True)
class Column:
    name: str
    type: str
    default_kind: str = ""  # "", DEFAULT, MATERIALIZED, ALIAS, EPHEMERAL


@dataclasses.dataclass(frozen=True)
class TableInfo:
    """What the modes need to know about a target table."""

    database: str
    table: str
    engine: str
    columns: tuple[Column, ...]
    create_query: str
    non_replicated_dedup_window: int
    replicated_dedup_window: int

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
        "SELECT engine, create_table_query FROM system.tables "
        "WHERE database = {d:String} AND name = {t:String}", params={"d": database, "t": table})
    if not rows:
        raise ConfigurationError(
            f"table {database}.{table} does not exist on {client.server}: create it first "
            "(or check the table option)")
    engine = str(rows[0]["engine"])
    ddl = str(rows[0]["create_table_query"])
    cols = client.query_json(
        "SELECT name, type, default_kind FROM system.columns "
        "WHERE database = {d:String} AND table = {t:String} ORDER BY position",
        params={"d": database, "t": table})
    defaults = {r["name"]: int(r["value"]) for r in client.query_json(
        "SELECT name, value FROM system.merge_tree_settings WHERE name IN "
        "('non_replicated_deduplication_window', 'replicated_deduplication_window')")}
    m = _WINDOW_RE.search(ddl)
    window = int(m.group(1)) if m else defaults.get("non_replicated_deduplication_window", 0)
    m = _REPL_WINDOW_RE.search(ddl.replace("non_replicated_deduplication_window", "_"))
    rwindow = int(m.group(1)) if m else defaults.get("replicated_deduplication_window", 0)
    return TableInfo(database, table, engine,
                     tuple(Column(str(c["name"]), str(c["type"]), str(c.get("default_kind") or ""))
                           for c in cols), ddl, window, rwindow)


# ---------------------------------------------------------------------- types

def split_args(inner: str) -> list[str]:
    """Split ``a, b(c, d), 'e,f'`` at top-level commas."""
    out, depth, cur, quote = [], 0, [], ""
    i = 0
    while i < len(inner):
        ch = inner[i]
        if quote:
            cur.append(ch)
            if ch == "\\" and i + 1 < len(inner):
                cur.append(inner[i + 1])
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'`\"":
            quote = ch
            cur.append(ch)
        elif ch == "(":
            depth += 1
            cur.append(ch)
        elif ch == ")":
            depth -= 1
            cur.append(ch)
        elif ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
        i += 1
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def parse_type(ch_type: str) -> tuple[str, list[str]]:
    """``Map(String, Array(Int8))`` -> (``Map``, [``String``, ``Array(Int8)``])."""
    t = ch_type.strip()
    m = re.match(r"^([A-Za-z0-9_]+)\s*\((.*)\)$", t, re.S)
    if not m:
        return t, []
    return m.group(1), split_args(m.group(2))


def _unwrap(ch_type: str) -> str:
    name, args = parse_type(ch_type)
    while name in ("Nullable", "LowCardinality") and args:
        name, args = parse_type(args[0])
        ch_type = args and f"{name}({', '.join(args)})" or name
    return ch_type


def _tuple_element_type(arg: str) -> str:
    """``a Int64`` -> ``Int64``; ``Int64`` -> ``Int64`` (named or unnamed tuple element)."""
    m = re.match(r"^(`(?:[^`\\]|\\.)*`|[A-Za-z_][A-Za-z0-9_]*)\s+(.+)$", arg.strip(), re.S)
    if m and not re.match(r"^[A-Za-z0-9_]+\s*\(", arg.strip()):
        return m.group(2)
    return arg


_INT = re.compile(r"^U?Int(8|16|32|64|128|256)$")
_ANY_VALUE = ("JSON", "Object", "Dynamic", "Variant")


def _family(ch_type: str) -> str:
    name, _ = parse_type(_unwrap(ch_type))
    if _INT.match(name):
        return "int"
    if name in ("Float32", "Float64", "BFloat16"):
        return "float"
    if name == "Bool":
        return "bool"
    if name.startswith("Decimal"):
        return "decimal"
    if name in ("String", "FixedString"):
        return "string"
    if name in ("Enum8", "Enum16", "Enum"):
        return "enum"
    if name in ("UUID", "IPv4", "IPv6"):
        return "textual"
    if name in ("Date", "Date32"):
        return "date"
    if name in ("DateTime", "DateTime64"):
        return "datetime"
    if name in ("Time", "Time64"):
        return "time"
    if name == "Array":
        return "array"
    if name == "Tuple":
        return "tuple"
    if name == "Map":
        return "map"
    if name in _ANY_VALUE:
        return "any"
    return "other"


#: Arrow family -> ClickHouse families an ArrowStream INSERT converts it to faithfully.
_ALLOWED: Mapping[str, frozenset[str]] = {
    "int": frozenset({"int", "float", "decimal", "bool", "date", "datetime", "enum"}),
    "bool": frozenset({"bool", "int"}),
    "float": frozenset({"float", "decimal"}),
    "decimal": frozenset({"decimal", "float"}),
    "string": frozenset({"string", "enum", "textual", "date", "datetime", "time"}),
    "binary": frozenset({"string", "textual"}),
    "date": frozenset({"date", "datetime"}),
    "timestamp": frozenset({"datetime", "date"}),
    "time": frozenset({"time"}),
    "list": frozenset({"array"}),
    "struct": frozenset({"tuple"}),
    "map": frozenset({"map"}),
    "null": frozenset({"int", "float", "bool", "decimal", "string", "enum", "textual", "date",
                       "datetime", "time", "array", "tuple", "map"}),
}


def _arrow_family(t: pa.DataType) -> str:
    if pa.types.is_dictionary(t):
        return _arrow_family(t.value_type)
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_decimal(t):
        return "decimal"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or getattr(pa.types, "is_string_view", lambda _: False)(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "binary"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp"
    if pa.types.is_time(t):
        return "time"
    if pa.types.is_map(t):
        return "map"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return "list"
    if pa.types.is_struct(t):
        return "struct"
    if pa.types.is_null(t):
        return "null"
    return "other"


def type_problem(arrow_type: pa.DataType, ch_type: str) -> str | None:
    """Why ``arrow_type`` cannot go into a ``ch_type`` column, or None if it can."""
    ch_fam = _family(ch_type)
    if ch_fam == "any":
        return None
    a_fam = _arrow_family(arrow_type)
    if a_fam == "other" or ch_fam == "other":
        # Types we do not model: only an exact structural match is safe to promise.
        return f"no known conversion from Arrow {arrow_type} to {ch_type}"
    if ch_fam not in _ALLOWED.get(a_fam, frozenset()):
        return f"Arrow {arrow_type} cannot be inserted into {ch_type}"
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    _, args = parse_type(_unwrap(ch_type))
    if a_fam == "list":
        return type_problem(arrow_type.value_type, args[0]) if args else None
    if a_fam == "map":
        if len(args) == 2:
            return type_problem(arrow_type.key_type, args[0]) or type_problem(arrow_type.item_type, args[1])
        return None
    if a_fam == "struct":
        if len(args) != arrow_type.num_fields:
            return (f"Arrow {arrow_type} has {arrow_type.num_fields} fields, "
                    f"{ch_type} has {len(args)} elements")
        for i, arg in enumerate(args):
            p = type_problem(arrow_type.field(i).type, _tuple_element_type(arg))
            if p:
                return p
    return None


def check_schema(info: TableInfo, schema: pa.Schema) -> None:
    """Raise ConfigurationError if ``schema`` cannot be inserted into the table.

    Every field of ``schema`` must name an insertable column of the table whose type
    accepts it. Table columns missing from the data get their defaults.
    """
    if len(schema) == 0:
        raise ConfigurationError(f"the data has no columns to insert into {info.display}")
    seen: set[str] = set()
    for field in schema:
        if field.name in seen:
            raise ConfigurationError(f"column {field.name!r} appears twice in the data for {info.display}")
        seen.add(field.name)
        col = info.column(field.name)
        if col is None:
            known = ", ".join(c.name for c in info.columns if c.default_kind not in ("MATERIALIZED", "ALIAS"))
            raise ConfigurationError(
                f"column {field.name!r} of the data ({field.type}) does not exist in table "
                f"{info.display} (its columns: {known})")
        if col.default_kind in ("MATERIALIZED", "ALIAS"):
            raise ConfigurationError(
                f"column {field.name!r} of table {info.display} is {col.default_kind} "
                f"({col.type}) and cannot be inserted into: drop it from the data")
        problem = type_problem(field.type, col.type)
        if problem:
            raise ConfigurationError(
                f"column {field.name!r}: data type {field.type} is incompatible with "
                f"{col.type} in table {info.display} ({problem})")
