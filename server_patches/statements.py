"""The SQL text of one HTTP request: which statement it is, its output format, its INSERT data.

Pure functions on the request's text; they run once per request on the handler's thread.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterator

_FORMAT_TAIL = re.compile(r"\bFORMAT\s+([A-Za-z][A-Za-z0-9_]*)\s*;?\s*$", re.I)
_INSERT_HEAD = re.compile(r"^\s*(?:(?:--[^\n]*\n|/\*.*?\*/)\s*)*INSERT\b", re.I | re.S)
_FIRST_WORD = re.compile(r"^\s*(?:(?:--[^\n]*\n|/\*.*?\*/)\s*)*([A-Za-z]+)", re.S)
# The body of `INSERT ... FORMAT Name` ends at one newline after the format name.
_INSERT_FORMAT = re.compile(rb"^(.*?\bFORMAT\s+([A-Za-z][A-Za-z0-9_]*))[ \t]*(\r?\n)?", re.I | re.S)
_MAX_INSERT_HEAD = 1 << 20

#: Statements a GET (readonly) request may run.
READ_ONLY_KEYWORDS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXISTS", "EXPLAIN", ""})
#: Statements that answer with a result set (ClickHouse then sends X-ClickHouse-Format);
#: "" is a statement that opens with a bracket, ``(SELECT 1)``.
RESULT_KEYWORDS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXISTS", "EXPLAIN", "CHECK", ""})
#: Statements that need a session: they act on the session's transaction.
TRANSACTION_KEYWORDS = frozenset({"BEGIN", "START", "COMMIT", "ROLLBACK"})


@dataclasses.dataclass
class Statement:
    """One request's statement: its SQL, and for ``INSERT ... FORMAT X`` the data stream."""

    sql: str
    insert_format: str | None = None
    data: Iterator[bytes] | None = None

    @property
    def keyword(self) -> str:
        return first_keyword(self.sql)

    @property
    def has_result(self) -> bool:
        """Whether it answers with rows (a SELECT) rather than nothing (DDL, SET, INSERT)."""
        return self.insert_format is None and self.keyword in RESULT_KEYWORDS

    @property
    def inline_insert(self) -> bool:
        """An INSERT that carries its data and has no SELECT: the kind ClickHouse queues
        when ``async_insert`` is 1 (``insert_query->hasInlinedData()`` in executeQuery)."""
        return self.insert_format is not None or inline_insert_text(self.sql)

    def output_format(self, default: str | None) -> str:
        """The format of the reply: the query's own ``FORMAT``, else ``default_format``."""
        if self.insert_format is not None:
            return self.insert_format
        m = _FORMAT_TAIL.search(self.sql)
        return m.group(1) if m else default or "TabSeparated"


_SHOW_CREATE_SYSTEM = re.compile(
    r"^\s*SHOW\s+CREATE\s+(?:TEMPORARY\s+)?(?:TABLE\s+)?`?system`?\s*\.\s*`?([A-Za-z0-9_]+)`?"
    r"(?:\s+FORMAT\s+[A-Za-z][A-Za-z0-9_]*)?\s*;?\s*$",
    re.I,
)
#: ``SHOW CREATE TABLE system.X`` as a server answers it, built from system.columns and
#: system.tables: chdb keeps no metadata for its system tables and refuses the statement.
SHOW_CREATE_SYSTEM_TABLE = """
SELECT concat('CREATE TABLE system.', name, '\\n(\\n',
    (SELECT arrayStringConcat(groupArray(concat('    `', name, '` ', type)), ',\\n')
     FROM (SELECT name, type FROM system.columns
           WHERE database = 'system' AND table = {table:String} ORDER BY position)),
    '\\n)\\nENGINE = ', engine,
    if(comment = '', '', concat('\\nCOMMENT \\'',
       replaceAll(replaceAll(comment, '\\\\', '\\\\\\\\'), '\\'', '\\\\\\''), '\\''))) AS statement
FROM system.tables WHERE database = 'system' AND name = {table:String}
"""


def system_table_in_show_create(sql: str) -> str | None:
    """The X of ``SHOW CREATE [TABLE] system.X``, else None."""
    m = _SHOW_CREATE_SYSTEM.match(sql)
    return m.group(1) if m else None


def first_keyword(sql: str) -> str:
    """The statement's first word, upper case, after comments ("" for an empty text)."""
    m = _FIRST_WORD.match(sql)
    return m.group(1).upper() if m else ""


def quote_identifier(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def quote_literal(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def decode_text(data: bytes) -> str:
    """Request text as str; bytes that are not UTF-8 survive as surrogates (see :func:`wire`)."""
    return data.decode("utf-8", "surrogateescape")


def wire(sql: str) -> str | bytes:
    """The statement as the engine gets it: the client's own bytes when they were not UTF-8
    (a binary query parameter bound into the text, as clickhouse-connect does)."""
    try:
        sql.encode("utf-8")
        return sql
    except UnicodeEncodeError:
        return sql.encode("utf-8", "surrogateescape")


def statement_of(query: str, body: Iterator[bytes] | None) -> Statement:
    """Join the ``query`` URL parameter and the body as ClickHouse does.

    ``INSERT ... FORMAT X`` in the URL makes the body its data; otherwise the body
    continues the query text. A query sent only in the body may carry its INSERT data
    after ``FORMAT X`` and one newline (clickhouse-connect's ``insert``).
    """
    if body is None:
        return Statement(query)
    if not query:
        return split_insert_body(body)
    if _INSERT_HEAD.match(query):
        m = _FORMAT_TAIL.search(query)
        if m:
            return Statement(query[: m.start()].rstrip(), m.group(1), body)
        return Statement(query + " " + decode_text(b"".join(body)))
    return Statement(query + "\n" + decode_text(b"".join(body)))


def split_insert_body(body: Iterator[bytes]) -> Statement:
    """Split ``INSERT ... FORMAT X\\n<data>`` sent whole in the body (clickhouse-connect ``insert``)."""
    head = b""
    for chunk in body:
        head += chunk
        if not re.match(rb"\s*(?:--[^\n]*\n\s*)*INSERT\b", head[:64], re.I) and len(head) >= 64:
            return Statement(decode_text(head + b"".join(body)))
        m = _INSERT_FORMAT.match(head)
        if m and (m.group(3) or len(head) > m.end(1)):
            sql = decode_text(m.group(1)[: -len(m.group(2))]).rstrip()
            sql = re.sub(r"\s*FORMAT\s*$", "", sql, flags=re.I)
            return Statement(sql, m.group(2).decode(), _prepend(head[m.end() :], body))
        if len(head) > _MAX_INSERT_HEAD:
            break
    text = decode_text(head)
    tail = _FORMAT_TAIL.search(text)
    if _INSERT_HEAD.match(text) and tail:
        return Statement(text[: tail.start()].rstrip(), tail.group(1), iter(()))
    return Statement(text)


# What follows the target of an INSERT: the first of these words outside quotes and comments.
_INSERT_BODY_WORD = re.compile(r"\b(VALUES|FORMAT|SELECT|WITH|INFILE)\b", re.I)
_INSERT_SETTINGS = re.compile(r"\bSETTINGS\s+", re.I)
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|`(?:[^`\\]|\\.)*`|\"(?:[^\"\\]|\\.)*\"|--[^\n]*|/\*.*?\*/", re.S)


def _masked(sql: str) -> str:
    """``sql`` with quoted strings, quoted identifiers and comments blanked out, same length:
    keywords found in it sit at the same offsets in ``sql``."""
    return _QUOTED.sub(lambda m: " " * len(m.group(0)), sql)


def inline_insert_text(sql: str) -> bool:
    """Whether an INSERT given whole in the text carries its data (``VALUES ...``,
    ``FORMAT X <data>``) rather than a SELECT or a file: ``INSERT INTO t (a) VALUES (1)``
    is, ``INSERT INTO t SELECT ...`` and ``INSERT INTO t FROM INFILE ...`` are not."""
    if not _INSERT_HEAD.match(sql):
        return False
    m = _INSERT_BODY_WORD.search(_masked(sql))
    return m is not None and m.group(1).upper() in ("VALUES", "FORMAT")


def insert_settings_clause(sql: str) -> list[tuple[str, str]]:
    """The INSERT's own ``SETTINGS a = 1, b = 'x'`` before its data, as (name, value) pairs.

    They override the request's and the session's settings for this one query, as
    ClickHouse applies them (``applySettingsFromQuery``) before it decides anything.
    """
    masked = _masked(sql)
    m = _INSERT_SETTINGS.search(masked)
    if not _INSERT_HEAD.match(sql) or m is None:
        return []
    end = _INSERT_BODY_WORD.search(masked, m.end())
    return set_assignments("SET " + sql[m.end() : end.start() if end else len(sql)])


def bool_setting(value: str | None) -> bool:
    """A Bool setting's text as ClickHouse reads it (``1``, ``true``, ``0``, ``false``, ...)."""
    text = (value or "").strip().strip("'").lower()
    if text in ("true", "yes", "on"):
        return True
    try:
        return float(text) != 0
    except ValueError:
        return False


def _prepend(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    if first:
        yield first
    yield from rest


def set_assignments(sql: str) -> list[tuple[str, str]]:
    """``SET a = 1, b = 'x,y'`` -> [(a, "1"), (b, "x,y")] (values unquoted)."""
    body = re.sub(r"^\s*SET\s+", "", sql.strip().rstrip(";"), flags=re.I)
    out = []
    for part in _split_top_level_commas(body):
        name, eq, value = part.partition("=")
        if eq:
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == "'":
                value = value[1:-1].replace("\\'", "'").replace("\\\\", "\\")
            out.append((name.strip(), value))
    return out


def _split_top_level_commas(text: str) -> list[str]:
    parts, cur, quote = [], "", None
    for ch in text:
        if quote:
            cur += ch
            if ch == quote and not cur.endswith("\\" + quote):
                quote = None
        elif ch in "'\"":
            quote = ch
            cur += ch
        elif ch == ",":
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts
