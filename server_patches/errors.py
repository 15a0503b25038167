"""ClickHouse's error codes, names and HTTP statuses, as the embedded HTTP front answers them.

An :class:`HTTPError` carries the code, the name and the text of one ClickHouse
exception; the handler turns it into ``Code: N. DB::Exception: ...`` with the status
ClickHouse's ``exceptionCodeToHTTPStatus`` gives that code.
"""

from __future__ import annotations

import re
from typing import Callable

# ClickHouse error codes used by the HTTP layer itself.
UNKNOWN_SETTING = 115
SESSION_NOT_FOUND = 372
SESSION_IS_LOCKED = 373
INVALID_SESSION_TIMEOUT = 374
AUTHENTICATION_FAILED = 516
CANNOT_DECOMPRESS = 271
UNKNOWN_FORMAT = 73
BAD_ARGUMENTS = 36
SYNTAX_ERROR = 62
UNKNOWN_TABLE = 60
UNKNOWN_DATABASE = 81
UNKNOWN_IDENTIFIER = 47
HTTP_LENGTH_REQUIRED = 381
NOT_IMPLEMENTED = 48
CANNOT_PARSE_INPUT_ASSERTION_FAILED = 27
TIMEOUT_EXCEEDED = 159
UNKNOWN_COMPRESSION_METHOD = 89
TOO_LARGE_SIZE_COMPRESSED = 39
READONLY = 164

ERROR_NAMES = {
    UNKNOWN_SETTING: "UNKNOWN_SETTING",
    SESSION_NOT_FOUND: "SESSION_NOT_FOUND",
    SESSION_IS_LOCKED: "SESSION_IS_LOCKED",
    INVALID_SESSION_TIMEOUT: "INVALID_SESSION_TIMEOUT",
    AUTHENTICATION_FAILED: "AUTHENTICATION_FAILED",
    CANNOT_DECOMPRESS: "CANNOT_DECOMPRESS",
    BAD_ARGUMENTS: "BAD_ARGUMENTS",
    HTTP_LENGTH_REQUIRED: "HTTP_LENGTH_REQUIRED",
    NOT_IMPLEMENTED: "NOT_IMPLEMENTED",
    TIMEOUT_EXCEEDED: "TIMEOUT_EXCEEDED",
}

# ClickHouse's exceptionCodeToHTTPStatus, by error name; codes are resolved from the
# engine itself at start-up (errorCodeToName) so no number is typed twice.
_STATUS_BY_NAME: dict[str, int] = {
    "REQUIRED_PASSWORD": 401,
    **dict.fromkeys(
        ("UNKNOWN_USER", "WRONG_PASSWORD", "AUTHENTICATION_FAILED", "SET_NON_GRANTED_ROLE", "ACCESS_DENIED"), 403
    ),
    **dict.fromkeys(
        (
            "BAD_ARGUMENTS",
            "CANNOT_COMPILE_REGEXP",
            "CANNOT_PARSE_TEXT",
            "CANNOT_PARSE_ESCAPE_SEQUENCE",
            "CANNOT_PARSE_QUOTED_STRING",
            "CANNOT_PARSE_DATE",
            "CANNOT_PARSE_DATETIME",
            "CANNOT_PARSE_NUMBER",
            "CANNOT_PARSE_DOMAIN_VALUE_FROM_STRING",
            "CANNOT_PARSE_IPV4",
            "CANNOT_PARSE_IPV6",
            "CANNOT_PARSE_INPUT_ASSERTION_FAILED",
            "CANNOT_PARSE_UUID",
            "DUPLICATE_COLUMN",
            "ILLEGAL_COLUMN",
            "UNKNOWN_ELEMENT_IN_AST",
            "UNKNOWN_TYPE_OF_AST_NODE",
            "THERE_IS_NO_COLUMN",
            "TOO_DEEP_AST",
            "TOO_BIG_AST",
            "UNEXPECTED_AST_STRUCTURE",
            "SYNTAX_ERROR",
            "INCORRECT_DATA",
            "TYPE_MISMATCH",
            "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE",
        ),
        400,
    ),
    **dict.fromkeys(
        (
            "UNKNOWN_TABLE",
            "UNKNOWN_FUNCTION",
            "UNKNOWN_IDENTIFIER",
            "UNKNOWN_TYPE",
            "UNKNOWN_STORAGE",
            "UNKNOWN_DATABASE",
            "UNKNOWN_SETTING",
            "UNKNOWN_DIRECTION_OF_SORTING",
            "UNKNOWN_AGGREGATE_FUNCTION",
            "UNKNOWN_FORMAT",
            "UNKNOWN_DATABASE_ENGINE",
            "UNKNOWN_TYPE_OF_QUERY",
            "UNKNOWN_ROLE",
        ),
        404,
    ),
    "QUERY_IS_TOO_LARGE": 413,
    "NOT_IMPLEMENTED": 501,
    "SOCKET_TIMEOUT": 503,
    "CANNOT_OPEN_FILE": 503,
    "CANNOT_SCHEDULE_TASK": 503,
    "HTTP_LENGTH_REQUIRED": 411,
    "TIMEOUT_EXCEEDED": 408,
    "UNSUPPORTED_MEDIA_TYPE": 415,
}
_HTTP_STATUS: dict[int, int] = {}  # filled by load_error_table from the engine's own table

_CODE_RE = re.compile(r"Code:\s*(\d+)\.")
_NESTED_PREFIX = re.compile(r"^(?:Code:\s*\d+\.\s*DB::Exception:\s*)+")
_NESTED_SUFFIX = re.compile(r"(?:\.?\s*\(([A-Z][A-Z0-9_]*)\)(?:\s*\(version ([^)]*)\))?)+\s*$")
# What chdb puts in front of the engine's text for a failed streaming call.
_CHDB_PREFIXES = ("Streaming insert finish failed: ", "Streaming query failed: ")


class HTTPError(Exception):
    """An error answered with ClickHouse's code, name and text."""

    def __init__(self, code: int, message: str, name: str | None = None) -> None:
        self.code = code
        self.name = name or ERROR_NAMES.get(code, "")
        self.text = message
        super().__init__(message)

    def body(self) -> bytes:
        """The reply body ClickHouse sends: ``Code: N. DB::Exception: text (NAME)``."""
        # As ClickHouse's getExceptionMessage: a full stop after the text, then the name.
        stop = "" if self.text.rstrip().endswith(".") else "."
        suffix = f"{stop} ({self.name})" if self.name and f"({self.name})" not in self.text else ""
        text = self.text if self.text.startswith("Code:") else f"Code: {self.code}. DB::Exception: {self.text}{suffix}"
        return (text.rstrip() + "\n").encode()

    @property
    def status(self) -> int:
        """The HTTP status ClickHouse answers this code with (500 when it names none)."""
        return _HTTP_STATUS.get(self.code, 500)

    @classmethod
    def from_engine(cls, exc: BaseException) -> "HTTPError":
        """The error the engine raised, as the one line a server would send."""
        text = str(exc)
        for prefix in _CHDB_PREFIXES:
            text = text.removeprefix(prefix)
        m = _CODE_RE.search(text)
        return cls(int(m.group(1)) if m else 1001, _tidy_engine_text(text))


def _tidy_engine_text(text: str) -> str:
    """chdb wraps an error once per layer (``Code: 73. DB::Exception: Code: 73. ...``);
    answer with the one line a server would send."""
    m = _CODE_RE.match(text.strip())
    if not m:
        return text
    body = _NESTED_PREFIX.sub("", text.strip())
    tail = _NESTED_SUFFIX.search(body)
    name = version = None
    if tail:
        names = re.findall(r"\(([A-Z][A-Z0-9_]*)\)", tail.group(0))
        versions = re.findall(r"\(version ([^)]*)\)", tail.group(0))
        name = names[-1] if names else None
        version = versions[0] if versions else None
        body = body[: tail.start()].rstrip()
        if not body.endswith("."):
            body += "."
    out = f"Code: {m.group(1)}. DB::Exception: {body}"
    if name:
        out += f" ({name})"
    if version:
        out += f" (version {version})"
    return out


def undecodable_error() -> HTTPError:
    """The engine's message quoted binary input that is not UTF-8, so its text is lost."""
    return HTTPError(
        117,
        "Cannot parse input: the data is not valid for the format "
        "(the engine's message quoted bytes that are not UTF-8)",
        "INCORRECT_DATA",
    )


def load_error_table(run_tsv: Callable[[str], str]) -> None:
    """Fill code -> name and code -> HTTP status from the engine's ``errorCodeToName``.

    Runs once per process, when the first engine connection opens.
    """
    if _HTTP_STATUS:
        return
    codes = run_tsv("SELECT number, errorCodeToName(number) FROM numbers(2000) WHERE errorCodeToName(number) != ''")
    for line in codes.splitlines():
        code, name = line.split("\t")
        ERROR_NAMES.setdefault(int(code), name)
        if name in _STATUS_BY_NAME:
            _HTTP_STATUS[int(code)] = _STATUS_BY_NAME[name]
