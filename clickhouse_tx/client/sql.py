"""Building SQL text safely: identifiers, string literals, query-parameter values.

Nothing user-supplied (database, table, column names; xids; JSON payloads) is ever
pasted raw into SQL. Identifiers go through :func:`quote_identifier`, values through
:func:`quote_string` or, preferably, server-side query parameters
(``{name:Type}`` in the text, the value as ``param_<name>``, formatted with
:func:`format_param`).
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping

from clickhouse_tx.errors import ConfigurationError

_IDENT_ESCAPES = {"\\": "\\\\", "`": "\\`", "\0": "\\0", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_STRING_ESCAPES = {"\\": "\\\\", "'": "\\'", "\0": "\\0", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Query parameters travel in ClickHouse's "escaped" text format (as in TabSeparated).
_PARAM_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\0": "\\0"}


def _escape(text: str, table: Mapping[str, str]) -> str:
    return "".join(table.get(ch, ch) for ch in text)


def quote_identifier(name: str) -> str:
    """Quote a database, table or column name with backticks.

    Backslashes and backticks inside the name are escaped, so any string (spaces,
    dots, quotes, backticks, SQL keywords, unicode) names exactly that identifier.

    Raises
    ------
    ValueError
        If ``name`` is empty (ClickHouse has no empty identifiers).
    """
    if not isinstance(name, str):
        raise TypeError(f"identifier must be a str, not {type(name).__name__}")
    if name == "":
        raise ValueError("identifier must not be empty")
    return "`" + _escape(name, _IDENT_ESCAPES) + "`"


def quote_option_identifier(name: str) -> str:
    """:func:`quote_identifier` for names that came from the user (options, CLI arguments).

    Raises
    ------
    ConfigurationError
        For an empty name, a NUL byte or a non-string, naming the value.
    """
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ConfigurationError(f"invalid identifier {name!r}")
    return quote_identifier(name)


def qualified(database: str, table: str) -> str:
    """``\\`db\\`.\\`table\\``` with both parts quoted."""
    return f"{quote_identifier(database)}.{quote_identifier(table)}"


def split_table(name: str, default_database: str | None = None) -> tuple[str, str]:
    """``"db.t"`` -> ``("db", "t")``: the one reading of a table name the user wrote.

    The first dot ends the database: a table name may contain dots, a database name
    may not. Without a dot the name is a table in ``default_database``; without a
    default a dot is required. Pure; wherever an option or argument names a table.

    Raises
    ------
    ConfigurationError
        An empty database or table part, or no dot and no default, naming the input.
    """
    db, dot, table = name.partition(".")
    if not dot and default_database is not None:
        db, table = default_database, name
    if not db or not table:
        expected = "database.table" if default_database is None else "table or database.table"
        raise ConfigurationError(f"table {name!r}: expected {expected}")
    return db, table


def quote_string(value: str) -> str:
    """A ClickHouse string literal: single quotes, backslash escapes."""
    if not isinstance(value, str):
        raise TypeError(f"string literal must be a str, not {type(value).__name__}")
    return "'" + _escape(value, _STRING_ESCAPES) + "'"


def quote_strings(values: Iterable[str]) -> str:
    """A parenthesised, comma-separated list of string literals for ``IN (...)``."""
    items = [quote_string(v) for v in values]
    if not items:
        raise ValueError("IN list must not be empty")
    return "(" + ", ".join(items) + ")"


def column_list(names: Iterable[str]) -> str:
    """``(\\`a\\`, \\`b\\`)`` for an INSERT column list."""
    items = [quote_identifier(n) for n in names]
    if not items:
        raise ValueError("column list must not be empty")
    return "(" + ", ".join(items) + ")"


def record_table_ddl(fq: str, columns: Iterable[tuple[str, str]], order_by: Iterable[str], settings: str = "") -> str:
    """``CREATE TABLE IF NOT EXISTS <fq> (<columns>) ENGINE = MergeTree ORDER BY (<order_by>)``:
    the DDL of every table the project keeps its own records in (markers, jobs, batch keys,
    dead letters). ``fq`` is already quoted; column names are quoted here; ``settings``
    is appended as ``SETTINGS ...`` when given."""
    cols = ", ".join(f"{quote_identifier(name)} {ch_type}" for name, ch_type in columns)
    keys = ", ".join(quote_identifier(name) for name in order_by)
    tail = f" SETTINGS {settings}" if settings else ""
    return f"CREATE TABLE IF NOT EXISTS {fq} ({cols}) ENGINE = MergeTree ORDER BY ({keys}){tail}"


_LEADING_COMMENTS = re.compile(r"^\s*(?:(?:--[^\n]*\n|/\*.*?\*/)\s*)*", re.S)


def is_insert(sql: str) -> bool:
    """Whether the statement is an ``INSERT`` (after any leading comments): the server
    contract's settings go with it (:mod:`clickhouse_tx.client.contract`)."""
    m = _LEADING_COMMENTS.match(sql)
    return sql[m.end() if m else 0 :][:6].upper() == "INSERT"


def format_param(value: object) -> str:
    """Format a Python value as the text of a ``param_<name>`` URL parameter.

    Strings use ClickHouse's escaped format; booleans become 0/1; ints and floats
    their decimal text; lists and tuples an array literal of quoted elements.
    """
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float)):
        return repr(value) if isinstance(value, float) else str(value)
    if isinstance(value, str):
        return _escape(value, _PARAM_ESCAPES)
    if isinstance(value, (list, tuple)):
        parts = []
        for v in value:
            if isinstance(v, str):
                parts.append(quote_string(v))
            elif isinstance(v, bool):
                parts.append("1" if v else "0")
            elif isinstance(v, (int, float)):
                parts.append(format_param(v))
            else:
                raise TypeError(f"unsupported array element type {type(v).__name__}")
        # An array is read as its literal (elements quoted, backslash-escaped): no
        # second escaping layer on top.
        return "[" + ",".join(parts) + "]"
    raise TypeError(f"unsupported query parameter type {type(value).__name__}")
