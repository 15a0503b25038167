"""The parameters of one HTTP request: URL query string, ``multipart/form-data`` fields,
external data files, and which of them are settings or query parameters.

As ClickHouse's ``HTTPHandler``: every parameter the HTTP layer does not consume
itself is a setting; ``param_<name>`` is the query parameter ``{name:Type}``. A
``multipart/form-data`` body adds its plain fields to the parameters (``query``,
``param_x``, settings) and turns each file part into an external table named by
the part, with ``<name>_structure`` or ``<name>_types`` and ``<name>_format``.
Runs once per request, on the handler's thread.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterator, Mapping
from urllib.parse import parse_qsl

from server_patches.errors import BAD_ARGUMENTS, HTTPError
from server_patches.statements import decode_text

# URL parameters the HTTP layer consumes itself; everything else is a setting.
HTTP_PARAMS = frozenset(
    {
        "query",
        "session_id",
        "session_timeout",
        "session_check",
        "query_id",
        "database",
        "default_format",
        "user",
        "password",
        "quota_key",
        "compress",
        "decompress",
        "buffer_size",
        "wait_end_of_query",
        "client_protocol_version",
        "stacktrace",
        "role",
        "enable_http_compression",
        "http_zlib_compression_level",
        "add_http_cors_header",
        "http_response_buffer_size",
        "max_query_size_http",
    }
)
_EXTERNAL_SUFFIXES = ("_structure", "_types", "_format")
_MAX_FORM_BYTES = 1 << 30
_BOUNDARY = re.compile(r'boundary="?([^";]+)"?', re.I)
_DISPOSITION_PARAM = re.compile(r';\s*([A-Za-z0-9_*-]+)="((?:[^"\\]|\\.)*)"|;\s*([A-Za-z0-9_*-]+)=([^;\s]*)')


@dataclasses.dataclass(frozen=True)
class ExternalTable:
    """One external data file: a temporary table the query may read."""

    name: str
    data: bytes
    fmt: str
    columns: str  # ``a UInt8, b String``, from <name>_structure or <name>_types


@dataclasses.dataclass
class RequestParams:
    """What one request asks for, split the way ClickHouse's HTTP handler splits it."""

    http: dict[str, str]
    settings: dict[str, str]
    query_params: dict[str, str]
    external: list[ExternalTable]

    def flag(self, name: str) -> bool:
        return self.http.get(name) in ("1", "true")


def url_params(query_string: str) -> dict[str, str]:
    """The URL's parameters (the last one wins when a name repeats, as in ClickHouse)."""
    return dict(parse_qsl(query_string, keep_blank_values=True, errors="surrogateescape"))


def is_multipart(content_type: str | None) -> bool:
    return (content_type or "").lower().startswith("multipart/form-data")


def request_params(params: Mapping[str, str], files: Mapping[str, bytes] | None = None) -> RequestParams:
    """Split ``params`` (URL and form fields) into HTTP parameters, settings and query parameters.

    ``files`` are the form's file parts, by name; each becomes an external table.
    """
    external = [_external_table(name, data, params) for name, data in (files or {}).items()]
    external_keys = {t.name + s for t in external for s in _EXTERNAL_SUFFIXES}
    settings: dict[str, str] = {}
    query_params: dict[str, str] = {}
    for k, v in params.items():
        if k.startswith("param_"):
            query_params[k[6:]] = v
        elif k not in HTTP_PARAMS and k not in external_keys:
            settings[k] = v
    return RequestParams(dict(params), settings, query_params, external)


def _external_table(name: str, data: bytes, params: Mapping[str, str]) -> ExternalTable:
    fmt = params.get(f"{name}_format") or "TabSeparated"
    if params.get(f"{name}_structure"):
        columns = params[f"{name}_structure"]
    elif params.get(f"{name}_types"):
        types = [t.strip() for t in params[f"{name}_types"].split(",")]
        columns = ", ".join(f"_{i} {t}" for i, t in enumerate(types, 1))
    else:
        raise HTTPError(
            BAD_ARGUMENTS,
            f"Neither structure nor types have not been provided for external "
            f"table {name}. Use fields {name}_structure or {name}_types to do so.",
        )
    return ExternalTable(name, data, fmt, columns)


def read_multipart(content_type: str, body: Iterator[bytes]) -> tuple[dict[str, str], dict[str, bytes]]:
    """A ``multipart/form-data`` body as (plain fields, file parts), both by part name."""
    m = _BOUNDARY.search(content_type)
    if not m:
        raise HTTPError(BAD_ARGUMENTS, "multipart/form-data without a boundary")
    data = _read_all(body)
    fields: dict[str, str] = {}
    files: dict[str, bytes] = {}
    delimiter = b"--" + m.group(1).encode()
    for part in data.split(delimiter)[1:]:
        if part.startswith(b"--"):
            break  # the closing delimiter
        head, sep, content = part.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        if not sep:
            raise HTTPError(BAD_ARGUMENTS, "Malformed multipart/form-data part: no blank line after its headers")
        name, filename = _disposition(head.decode("latin-1"))
        content = content.removesuffix(b"\r\n")
        if filename is not None:
            files[name] = content
        else:
            fields[name] = decode_text(content)
    return fields, files


def _read_all(body: Iterator[bytes]) -> bytes:
    out = bytearray()
    for chunk in body:
        out += chunk
        if len(out) > _MAX_FORM_BYTES:
            raise HTTPError(BAD_ARGUMENTS, f"multipart/form-data body larger than {_MAX_FORM_BYTES} bytes")
    return bytes(out)


def _disposition(head: str) -> tuple[str, str | None]:
    """The ``name`` and ``filename`` (None for a plain field) of one part's headers."""
    for line in head.split("\r\n"):
        key, _, value = line.partition(":")
        if key.strip().lower() == "content-disposition":
            attrs = {(a or c).lower(): (b if a else d) for a, b, c, d in _DISPOSITION_PARAM.findall(value)}
            if "name" in attrs:
                return attrs["name"], attrs.get("filename")
    raise HTTPError(BAD_ARGUMENTS, "multipart/form-data part without Content-Disposition name")
