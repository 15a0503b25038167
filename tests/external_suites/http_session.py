"""One client connection of a test, over ClickHouse's HTTP interface.

``clickhouse-client`` holds one server session per connection: ``SET`` values and an
open transaction last until it disconnects. Over HTTP the same is a named session
(``session_id``) that every statement of the connection names.

Plain ``requests``, not the project's ``clickhouse_tx.client.http``: a test compares
the reply's bytes, in the format the statement asks for, with its ``.reference`` file,
as clickhouse-client prints them, and it expects errors by code; the project's client
parses replies and maps errors for the write protocol instead.
"""

from __future__ import annotations

import dataclasses
import re
import uuid

import requests

_CODE = re.compile(r"Code: (\d+)\.")
_NAME = re.compile(r"\(([A-Z][A-Z0-9_]+)\)")
_IN_BODY = b"__exception__\r\n"


@dataclasses.dataclass(frozen=True)
class Reply:
    """What the server sent: ``body`` (the rows written before any error) and, for an
    error, its ``code``, ``name`` and ``message`` (``code`` None: no error)."""

    body: bytes
    code: int | None = None
    name: str | None = None
    message: str = ""


def _error(body: bytes, header_code: str | None) -> Reply:
    """The error reply, or the error ClickHouse wrote into the body after sending rows."""
    cut = body.find(_IN_BODY)
    rows, text = (body, body) if cut < 0 else (body[:cut], body[cut + len(_IN_BODY) :])
    message = text.decode("utf-8", "replace")
    m = _CODE.search(message)
    code = int(header_code) if header_code else (int(m.group(1)) if m else -1)
    names = _NAME.findall(message.split("\n", 1)[0])
    return Reply(rows if cut >= 0 else b"", code, names[-1] if names else None, message.strip())


class HttpSession:
    """Statements of one test connection: one ``session_id``, the test's database."""

    def __init__(self, url: str, database: str, *, auth: tuple[str, str] | None = None, timeout_s: float = 300) -> None:
        self.url, self.database, self.auth, self.timeout_s = url.rstrip("/") + "/", database, auth, timeout_s
        self.http = requests.Session()
        self.session_id = f"stateless_{uuid.uuid4().hex}"

    def run(self, sql: str, **settings: str) -> Reply:
        params = {"session_id": self.session_id, "session_timeout": "600", "database": self.database, **settings}
        return self._post(sql, params)

    def _post(self, sql: str, params: dict[str, str]) -> Reply:
        r = self.http.post(self.url, params=params, data=sql.encode(), auth=self.auth, timeout=self.timeout_s)
        if r.status_code != 200 or _IN_BODY in r.content:
            return _error(r.content, r.headers.get("X-ClickHouse-Exception-Code"))
        return Reply(r.content)

    def close(self) -> None:
        self.http.close()


def run_once(url: str, sql: str, *, auth: tuple[str, str] | None = None) -> Reply:
    """One statement outside any session (database administration of the runner)."""
    s = HttpSession(url, "default", auth=auth)
    try:
        return s._post(sql, {"database": "default"})
    finally:
        s.close()
