"""ClickHouse type expressions, parsed once into values (pure, no I/O).

:func:`parse_clickhouse_type` reads a type as ``system.columns.type`` prints it
(``Nullable(...)``, ``Array(...)``, named ``Tuple(...)``, ``Enum8('a' = 1)``,
``DateTime64(6, 'UTC')``, ...) into a frozen :class:`CHType`. It is the one parser of
the project: the driver-side schema check (:mod:`clickhouse_tx.conversion.schema`), the value
converter (:mod:`clickhouse_tx.conversion.convert`) and the Spark data source all use it. Runs on
the driver once per query and on executors once per column and process (cached).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from clickhouse_tx.errors import ConfigurationError

__all__ = ["CHType", "parse_clickhouse_type", "strip_wrappers", "tuple_element_name"]


def tuple_element_name(name: str) -> str:
    """A Tuple element name quoted the way ClickHouse prints it (backslash escapes in backticks)."""
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


# Hostile input bounds: the parser is recursive.
_MAX_TYPE_LEN = 1 << 16
_MAX_DEPTH = 64

# Aliases system.columns never prints but users may type.
_ALIASES = {
    "boolean": "Bool",
    "bool": "Bool",
    "tinyint": "Int8",
    "smallint": "Int16",
    "int": "Int32",
    "integer": "Int32",
    "bigint": "Int64",
    "float": "Float32",
    "double": "Float64",
    "real": "Float32",
    "text": "String",
    "varchar": "String",
    "char": "String",
    "blob": "String",
    "bytea": "String",
    "date": "Date",
    "datetime": "DateTime",
    "timestamp": "DateTime",
}
_DECIMAL_N = {"Decimal32": 9, "Decimal64": 18, "Decimal128": 38, "Decimal256": 76}
# Bodies we keep as raw text: settings-like arguments the relation never inspects.
_RAW_BODY = {"JSON", "Object", "Dynamic", "AggregateFunction", "SimpleAggregateFunction"}


@dataclasses.dataclass(frozen=True)
class CHType:
    """A parsed ClickHouse type expression.

    Attributes
    ----------
    name
        Canonical type name (``Int32``, ``Nullable``, ``Tuple``, ``Decimal`` ...).
    args
        Type arguments: nested :class:`CHType` for ``Nullable``/``Array``/``Map``/
        ``Tuple``/``Variant``/``LowCardinality``; ints and strings for ``Decimal``,
        ``DateTime64``, ``FixedString``; ``(label, value)`` pairs for ``Enum``; the raw
        body text for JSON-like types.
    names
        Element names of a named ``Tuple`` (``None`` for unnamed elements).
    """

    name: str
    args: tuple[Any, ...] = ()
    names: tuple[Any, ...] = ()

    def __str__(self) -> str:
        if not self.args:
            return self.name
        if self.name in _RAW_BODY:
            return f"{self.name}({self.args[0]})"
        parts = []
        for i, a in enumerate(self.args):
            if self.name.startswith("Enum"):
                parts.append(f"{_sql_string(a[0])} = {a[1]}")
            elif isinstance(a, CHType):
                n = self.names[i] if i < len(self.names) else None
                parts.append(f"{tuple_element_name(n)} {a}" if n is not None else str(a))
            elif isinstance(a, str):
                parts.append(_sql_string(a))
            else:
                parts.append(str(a))
        return f"{self.name}({', '.join(parts)})"


def _sql_string(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, what: str) -> ConfigurationError:
        shown = self.text if len(self.text) <= 200 else self.text[:200] + "..."
        return ConfigurationError(f"cannot parse ClickHouse type {shown!r}: {what} at offset {self.pos}")

    def ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self) -> str:
        self.ws()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def expect(self, ch: str) -> None:
        if self.peek() != ch:
            raise self.fail(f"expected {ch!r}")
        self.pos += 1

    def ident(self) -> str:
        """A bare or backquoted identifier."""
        self.ws()
        t = self.text
        if self.pos < len(t) and t[self.pos] in '`"':
            return self.quoted(t[self.pos])
        start = self.pos
        while self.pos < len(t) and (t[self.pos].isalnum() or t[self.pos] in "_."):
            self.pos += 1
        if start == self.pos:
            raise self.fail("expected a name")
        return t[start : self.pos]

    def quoted(self, q: str) -> str:
        t = self.text
        self.pos += 1
        out = []
        while True:
            if self.pos >= len(t):
                raise self.fail("unterminated quote")
            c = t[self.pos]
            if c == "\\":
                if self.pos + 1 >= len(t):
                    raise self.fail("dangling backslash")
                out.append(t[self.pos + 1])
                self.pos += 2
            elif c == q:
                if self.pos + 1 < len(t) and t[self.pos + 1] == q:  # doubled quote
                    out.append(q)
                    self.pos += 2
                else:
                    self.pos += 1
                    return "".join(out)
            else:
                out.append(c)
                self.pos += 1

    def number(self) -> int:
        self.ws()
        t = self.text
        start = self.pos
        if self.pos < len(t) and t[self.pos] in "+-":
            self.pos += 1
        while self.pos < len(t) and t[self.pos].isdigit():
            self.pos += 1
        if self.pos == start or not t[start : self.pos].lstrip("+-"):
            raise self.fail("expected a number")
        return int(t[start : self.pos])

    def raw_body(self) -> str:
        """Text up to the matching ')' (quotes respected); the ')' is consumed."""
        t = self.text
        depth = 0
        start = self.pos
        while self.pos < len(t):
            c = t[self.pos]
            if c in "'`\"":
                self.quoted(c)
                continue
            if c == "(":
                depth += 1
            elif c == ")":
                if depth == 0:
                    body = t[start : self.pos].strip()
                    self.pos += 1
                    return body
                depth -= 1
            self.pos += 1
        raise self.fail("unbalanced parentheses")

    def type_(self, depth: int) -> CHType:
        if depth > _MAX_DEPTH:
            raise self.fail(f"nesting deeper than {_MAX_DEPTH}")
        name = self.ident()
        name = _ALIASES.get(name.lower(), name)
        if self.peek() != "(":
            if name in _DECIMAL_N or name in (
                "Nullable",
                "Array",
                "LowCardinality",
                "Map",
                "FixedString",
                "Enum8",
                "Enum16",
                "Decimal",
            ):
                raise self.fail(f"{name} needs arguments")
            return CHType(name)
        self.pos += 1
        if name in _RAW_BODY:
            return CHType(name, (self.raw_body(),))
        if name in ("Enum8", "Enum16", "Enum"):
            return self.enum_body(name)
        args: list[Any] = []
        names: list[Any] = []
        if self.peek() == ")":
            self.pos += 1
        else:
            while True:
                n, a = self.argument(name, depth)
                args.append(a)
                names.append(n)
                if not self.more():
                    break
        return self.normalise(name, tuple(args), tuple(names))

    def more(self) -> bool:
        """After a list item: True past a ``,`` (another item follows), False past ``)``."""
        c = self.peek()
        if c in (",", ")"):
            self.pos += 1
            return c == ","
        raise self.fail("expected ',' or ')'")

    def argument(self, owner: str, depth: int) -> tuple[str | None, object]:
        c = self.peek()
        if c == "'":
            return None, self.quoted("'")
        if c and (c.isdigit() or c in "+-"):
            return None, self.number()
        if owner in ("Tuple", "Nested"):
            # `name Type` or just `Type`: a name is followed by another name.
            save = self.pos
            first = self.ident()
            nxt = self.peek()
            if nxt and (nxt.isalpha() or nxt in '_`"'):
                return first, self.type_(depth + 1)
            self.pos = save
        return None, self.type_(depth + 1)

    def enum_body(self, name: str) -> CHType:
        pairs: list[tuple[str, int]] = []
        while True:
            if self.peek() != "'":
                raise self.fail("expected an enum label")
            label = self.quoted("'")
            if self.peek() == "=":
                self.pos += 1
                value = self.number()
            else:
                value = len(pairs) + 1  # ClickHouse numbers unlabelled values from 1
            pairs.append((label, value))
            if not self.more():
                break
        return CHType("Enum8" if name == "Enum" else name, tuple(pairs))

    def normalise(self, name: str, args: tuple[Any, ...], names: tuple[Any, ...]) -> CHType:
        def types_only(n: int | None = None) -> None:
            if n is not None and len(args) != n:
                raise self.fail(f"{name} takes {n} type argument(s), got {len(args)}")
            if not all(isinstance(a, CHType) for a in args):
                raise self.fail(f"{name} takes types as arguments")

        def ints(lo: int, hi: int) -> None:
            if not lo <= len(args) <= hi or not all(isinstance(a, int) for a in args):
                raise self.fail(f"{name} takes {lo}..{hi} integer argument(s)")

        if name in ("Nullable", "Array", "LowCardinality"):
            types_only(1)
        elif name == "Map":
            types_only(2)
        elif name in ("Tuple", "Variant", "Nested"):
            types_only()
            if name == "Tuple" and names and any(n is not None for n in names) and any(n is None for n in names):
                raise self.fail("Tuple mixes named and unnamed elements")
            return CHType(name, args, names if any(n is not None for n in names) else ())
        elif name in _DECIMAL_N:
            ints(1, 1)
            return CHType("Decimal", (_DECIMAL_N[name], args[0]))
        elif name == "Decimal":
            ints(1, 2)
            p, s = args[0], args[1] if len(args) > 1 else 0
            if not (1 <= p <= 76 and 0 <= s <= p):
                raise self.fail(f"bad Decimal precision/scale ({p}, {s})")
            return CHType("Decimal", (p, s))
        elif name == "FixedString":
            ints(1, 1)
            if args[0] < 1:
                raise self.fail("FixedString length must be positive")
        elif name in ("DateTime64", "Time64"):
            if (
                not args
                or not isinstance(args[0], int)
                or len(args) > 2
                or (len(args) == 2 and not isinstance(args[1], str))
            ):
                raise self.fail(f"{name} takes (precision[, 'timezone'])")
            if not 0 <= args[0] <= 9:
                raise self.fail(f"{name} precision must be 0..9")
        elif name == "DateTime" and (len(args) > 1 or (args and not isinstance(args[0], str))):
            raise self.fail("DateTime takes (['timezone'])")
        return CHType(name, args)


@functools.lru_cache(maxsize=4096)
def parse_clickhouse_type(text: str) -> CHType:
    """Parse a ClickHouse type expression (as ``system.columns.type`` prints it).

    Raises
    ------
    ConfigurationError
        On anything malformed, with the (truncated) text and the offset.

    Notes
    -----
    Cached per process (CHType is frozen): executors parse each column type once.
    """
    if not isinstance(text, str):
        raise ConfigurationError(f"a ClickHouse type must be a string, got {type(text).__name__}")
    if len(text) > _MAX_TYPE_LEN:
        raise ConfigurationError(f"ClickHouse type expression is too long ({len(text)} characters)")
    p = _Parser(text)
    t = p.type_(0)
    if p.peek():
        raise p.fail("unexpected text after the type")
    return t


def strip_wrappers(t: CHType) -> tuple[CHType, bool]:
    """(inner type, is Nullable) with ``LowCardinality`` and ``Nullable`` removed at any level."""
    nullable = False
    while t.name in ("LowCardinality", "Nullable"):
        if t.name == "Nullable":
            nullable = True
        t = t.args[0]
    return t, nullable
