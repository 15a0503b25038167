"""A ClickHouse test script split into statements the way ``clickhouse-client`` splits it.

ClickHouse's stateless tests (``tests/queries/0_stateless/*.sql``) are piped into
``clickhouse-client --multiquery``. The client (``ClientBase::executeMultiQuery``) cuts
the text at each ``;`` outside quotes and comments, sends the statement with its
leading comments (they reach ``system.query_log``: tests match on them), and takes the
rest of the line after the ``;`` as part of the statement for its *test hints*
(``TestHint``): ``-- { serverError CODE }`` or ``-- { clientError CODE }`` in a comment
that follows the first token. Hints in leading comments are ignored, as the client does.
"""

from __future__ import annotations

import dataclasses
import re

_HINT = re.compile(r"\{\s*(serverError|clientError)\s+([^}]*)\}")


@dataclasses.dataclass(frozen=True)
class Expected:
    """An error the test expects: ``kind`` is ``serverError`` or ``clientError``;
    ``codes`` holds numbers or names (``645``, ``INVALID_TRANSACTION``), any of them."""

    kind: str
    codes: tuple[str, ...]

    def matches(self, code: int | None, name: str | None) -> bool:
        return any(c == str(code) or (name is not None and c == name) for c in self.codes)


@dataclasses.dataclass(frozen=True)
class Statement:
    """One statement as the client sends it (leading comments kept, no ``;``)."""

    text: str
    expected: Expected | None = None


def _skip_quoted(text: str, i: int) -> int:
    """Index after the quoted token starting at ``text[i]`` (backslash and doubled quotes)."""
    quote, i = text[i], i + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text[i] == quote:
            if i + 1 < len(text) and text[i + 1] == quote:
                i += 2
            else:
                return i + 1
        else:
            i += 1
    return i


def _tokens(text: str) -> list[tuple[str, int, int]]:
    """(kind, start, end) of comments (``comment``), ``;`` (``end``) and the rest (``code``)."""
    out: list[tuple[str, int, int]] = []
    i = 0
    while i < len(text):
        c, nxt = text[i], text[i : i + 2]
        if nxt == "--" or c == "#":
            j = text.find("\n", i)
            j = len(text) if j < 0 else j
            out.append(("comment", i, j))
        elif nxt == "/*":
            j = text.find("*/", i + 2)
            j = len(text) if j < 0 else j + 2
            out.append(("comment", i, j))
        elif c in "'\"`":
            j = _skip_quoted(text, i)
            out.append(("code", i, j))
        elif c == ";":
            j = i + 1
            out.append(("end", i, j))
        else:
            j = i + 1
            if not c.isspace():
                out.append(("code", i, j))
        i = j
    return out


def _hint(text: str, comments: list[tuple[int, int]]) -> Expected | None:
    for start, end in comments:
        m = _HINT.search(text, start, end)
        if m:
            codes = tuple(c for c in re.split(r"[\s,|]+", m.group(2).strip()) if c)
            return Expected(m.group(1), codes)
    return None


def split_statements(script: str) -> list[Statement]:
    """The statements of ``script`` in order, each with the error hint it carries."""
    toks = _tokens(script)
    out: list[Statement] = []
    begin, seen_code, hint_comments = 0, False, []
    k = 0
    while k < len(toks):
        kind, start, end = toks[k]
        if kind == "code":
            seen_code = True
        elif kind == "comment" and seen_code:
            hint_comments.append((start, end))
        elif kind == "end":
            line_end = script.find("\n", end)
            line_end = len(script) if line_end < 0 else line_end
            while k + 1 < len(toks) and toks[k + 1][1] < line_end and toks[k + 1][0] == "comment":
                k += 1
                hint_comments.append(toks[k][1:])
            if seen_code:
                out.append(Statement(script[begin:start].strip(), _hint(script, hint_comments)))
            begin, seen_code, hint_comments = max(end, toks[k][2]), False, []
        k += 1
    if seen_code:
        out.append(Statement(script[begin:].strip(), _hint(script, hint_comments)))
    return out


def substitute(script: str, database: str) -> str:
    """``{CLICKHOUSE_DATABASE}`` and ``{CLICKHOUSE_DATABASE_1}`` as clickhouse-test replaces them."""
    return script.replace("{CLICKHOUSE_DATABASE_1}", database + "_1").replace("{CLICKHOUSE_DATABASE}", database)
