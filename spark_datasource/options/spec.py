"""Options declared once: each option's name, type, default, parser and doc line.

Both sources of options in the project read through this module: the
``clickhouse_tx`` writer (:mod:`spark_datasource.options.writer_specs`) and the
``kafka_py`` source (:mod:`spark_datasource.kafka.option_specs`). A declaration pairs
an option with its default and one of the shared parsers below, as pyiceberg pairs a
table property with its default and clickhouse-connect declares each setting once. The
option tables of ``docs/options.md`` and ``docs/kafka.md`` are generated from the
declarations (:mod:`spark_datasource.option_docs`), and a unit test holds them equal.

Every malformed value is refused with one error format, :func:`bad_value`: the
option, the value as given (a secret one as ``***``) and what was expected. Everything
here runs on the driver, when a source or writer parses its options, before any task.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from typing import Any, Callable, Generic, Iterable, Mapping, TypeVar
from urllib.parse import urlsplit, urlunsplit

from clickhouse_tx.errors import ConfigurationError

#: The parsed type of one option.
T = TypeVar("T")

__all__ = [
    "OptionSpec",
    "OptionFamily",
    "Parser",
    "Expected",
    "bad_value",
    "BOOL",
    "HTTP_URL",
    "POSITIVE_INT",
    "POSITIVE_SECONDS",
    "DURATION_MS",
    "SQL_EXPRESSION",
    "TEXT",
    "int_at_least",
    "one_of",
    "matching",
    "lower_keys",
]

#: Longest part of a value shown in an error.
_SHOWN_CHARS = 200


def bad_value(option: str, value: str, expected: str, *, source: str = "", secret: bool = False) -> ConfigurationError:
    """The one error of a malformed option value: ``[source ]option name='value': expected ...``.

    ``secret`` shows the value as ``***`` (passwords never reach an error).
    """
    text = str(value)
    shown = "***" if secret else repr(text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "...")
    prefix = f"{source} " if source else ""
    return ConfigurationError(f"{prefix}option {option}={shown}: expected {expected}")


class Expected(ValueError):
    """Raised by a parser to say what it expected of this value (else its ``expected``)."""


@dataclasses.dataclass(frozen=True)
class Parser(Generic[T]):
    """Text to a value. ``convert`` raises ``ValueError`` on a bad value (:class:`Expected`
    to say what it expected of that one value, instead of ``expected``)."""

    expected: str
    convert: Callable[[str], T]
    #: How a refused value is shown (a URL without its credentials); None: as given.
    shown: Callable[[str], str] | None = None


def _to_bool(text: str) -> bool:
    v = text.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise ValueError()


def int_at_least(minimum: int) -> Parser[int]:
    """An integer ``>= minimum``."""

    def convert(text: str) -> int:
        n = int(text.strip())  # ValueError on anything else
        if n < minimum:
            raise ValueError()
        return n

    return Parser(f"an integer >= {minimum}", convert)


def _positive_seconds(text: str) -> float:
    x = float(text.strip())
    if not math.isfinite(x) or x <= 0:
        raise ValueError()
    return x


#: Spark's time strings, as milliseconds: a bare number is ms.
_TIME_UNITS_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _duration_ms(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", text.lower())
    if not m or m.group(2) not in ("", *_TIME_UNITS_MS):
        raise ValueError()
    return int(int(m.group(1)) * _TIME_UNITS_MS.get(m.group(2) or "ms", 1))


def _sql_expression(text: str) -> str:
    # order_by/partition_by/engine are SQL by nature (the user's own), but a ';' can
    # only be a mistake or an injection.
    if ";" in text or "\x00" in text:
        raise Expected("one SQL expression (no ';')")
    if not text.strip():
        raise Expected("a non-empty SQL expression")
    return text.strip()


def _text(text: str) -> str:
    if not text.strip():
        raise ValueError()
    return text.strip()


def _http_url(text: str) -> str:
    v = text.strip()
    try:
        parts = urlsplit(v)
        _ = parts.port  # raises ValueError on a non-numeric port
    except ValueError:
        raise ValueError() from None
    if parts.username is not None or parts.password is not None:
        # The URL would carry the password into every repr and log line.
        raise Expected("no credentials in the url; use the user and password options")
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ValueError()
    if parts.query or parts.fragment:
        raise Expected("a url without query or fragment (use setting.<name> options)")
    return urlunsplit((parts.scheme.lower(), parts.netloc, parts.path.rstrip("/"), "", ""))


def _safe_url(text: str) -> str:
    from clickhouse_tx.client.http import safe_url  # the one credential-free form of a URL

    return safe_url(text.strip())


def one_of(*choices: str) -> Parser[str]:
    """One of ``choices``, any case (returned lower-cased)."""

    def convert(text: str) -> str:
        v = text.strip().lower()
        if v not in choices:
            raise ValueError()
        return v

    listed = ", ".join(choices[:-1]) + f" or {choices[-1]}" if len(choices) > 1 else choices[0]
    return Parser(listed, convert)


def matching(pattern: str, expected: str) -> Parser[str]:
    """Text (stripped) matching ``pattern`` in full."""
    regex = re.compile(pattern)

    def convert(text: str) -> str:
        if not regex.fullmatch(text.strip()):
            raise ValueError()
        return text.strip()

    return Parser(expected, convert)


BOOL = Parser("true or false (also 1/0, yes/no, any case)", _to_bool)
POSITIVE_INT = int_at_least(1)
POSITIVE_SECONDS = Parser("a positive number of seconds", _positive_seconds)
DURATION_MS = Parser("a duration like 15m, 30s or 500ms (a bare number is ms)", _duration_ms)
SQL_EXPRESSION = Parser("one SQL expression (no ';')", _sql_expression)
TEXT = Parser("a non-empty value", _text)
#: An HTTP(S) server URL, normalised; never with credentials, which a refused one does not show.
HTTP_URL = Parser("http(s)://host[:port]", _http_url, shown=_safe_url)


@dataclasses.dataclass(frozen=True)
class OptionSpec(Generic[T]):
    """One option, declared once.

    Attributes
    ----------
    name
        As the user spells it (``batch_size``, ``maxOffsetsPerTrigger``); a family of
        options is written ``setting.<name>`` or ``fault.*``. Keys are compared lower-cased.
    default
        The value when the option is not given (None: none).
    parser
        The shared parser of its values.
    doc
        The meaning: one line of the docs' option table.
    shown_default
        The docs' default column when it is not the plain default (``required``, a rule).
    field
        The attribute of the parsed options it fills on its own (None: read by a rule of
        the source's parse, which also checks it against other options).
    source
        The error prefix of the source (``kafka_py``), empty for the writer.
    secret
        Its value never appears in an error.
    blank_is_default
        An empty value means the default (else it is parsed, and usually refused).
    aliases, section
        Other names of the same option; the docs' table it is listed in.
    """

    name: str
    default: T
    parser: Parser[T]
    doc: str
    shown_default: str | None = None
    field: str | None = None
    source: str = ""
    secret: bool = False
    blank_is_default: bool = False
    aliases: tuple[str, ...] = ()
    section: str = ""

    @property
    def key(self) -> str:
        """The lower-cased key Spark delivers (a family: its prefix, such as ``setting.``)."""
        return self.name.split("<")[0].rstrip("*").lower()

    @property
    def is_family(self) -> bool:
        return "<" in self.name or self.name.endswith("*")

    def parse(self, raw: str) -> T:
        """``raw`` parsed, or :func:`bad_value` naming this option."""
        try:
            return self.parser.convert(str(raw))
        except ValueError as e:
            expected = str(e) if isinstance(e, Expected) else self.parser.expected
            shown = self.parser.shown(str(raw)) if self.parser.shown else raw
            raise bad_value(self.name, shown, expected, source=self.source, secret=self.secret) from None

    def read(self, opts: Mapping[str, str]) -> T:
        """The option's value in lower-cased ``opts``: parsed, or the default when absent."""
        raw = next((opts[k] for k in (self.key, *(a.lower() for a in self.aliases)) if k in opts), None)
        if raw is None or (self.blank_is_default and not str(raw).strip()):
            return self.default
        return self.parse(raw)


class OptionFamily:
    """The options of one source: looked up by name, unknown keys refused with close matches."""

    def __init__(self, source: str, docs: str, specs: Iterable[OptionSpec[Any]]) -> None:
        self.source = source
        self.docs = docs
        self.specs: tuple[OptionSpec[Any], ...] = tuple(specs)
        self._by_key = {k: s for s in self.specs if not s.is_family for k in (s.key, *(a.lower() for a in s.aliases))}
        self.prefixes = tuple(s.key for s in self.specs if s.is_family)

    def __getitem__(self, name: str) -> OptionSpec[Any]:
        return self._by_key[name.lower()]

    def default(self, name: str) -> Any:
        """The declared default of option ``name``."""
        return self[name].default

    def known_keys(self) -> tuple[str, ...]:
        """Every plain option's lower-cased key (aliases included; families left out)."""
        return tuple(self._by_key)

    def read_all(self, opts: Mapping[str, str]) -> dict[str, Any]:
        """Every plain option's value in lower-cased ``opts``, by name: parsed, or its default.

        Raises
        ------
        ConfigurationError
            The first malformed value (:func:`bad_value`).
        """
        return {s.name: s.read(opts) for s in self.specs if not s.is_family}

    def refuse_unknown(self, opts: Mapping[str, str]) -> None:
        """Every key of ``opts`` (lower-cased) is declared or of a family; else name the close matches.

        Raises
        ------
        ConfigurationError
            Naming every unknown key, each with up to three close matches.
        """
        unknown = sorted(k for k in opts if k not in self._by_key and not k.startswith(self.prefixes))
        if not unknown:
            return
        names = {k: s.name for k, s in self._by_key.items()}
        lines = []
        for k in unknown:
            close = [names[c] for c in difflib.get_close_matches(k, list(names), n=3, cutoff=0.6)]
            lines.append(k + (f" (did you mean {', '.join(close)}?)" if close else ""))
        raise ConfigurationError(f"unknown option(s) of {self.source}: {'; '.join(lines)} (see {self.docs})")


def lower_keys(options: Mapping[str, Any]) -> dict[str, str]:
    """Keys stripped and lower-cased (as Spark delivers them), values as strings.

    Raises
    ------
    ConfigurationError
        The same option given twice in different cases.
    """
    opts: dict[str, str] = {}
    for k, v in dict(options).items():
        key = str(k).strip().lower()
        if key in opts:
            raise ConfigurationError(f"option {key} is given twice (options are case-insensitive)")
        opts[key] = "" if v is None else str(v)
    return opts
