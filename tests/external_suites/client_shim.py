"""``$CLICKHOUSE_CLIENT -q "..."`` of a ClickHouse shell test, served over HTTP.

The stateless shell tests call ``clickhouse-client`` (the native protocol, which the
embedded server does not speak) mostly to run a few statements:
``$CLICKHOUSE_CLIENT -q "CREATE ...; INSERT ..."``. This stand-in does exactly that over
one HTTP session (one client connection): the statements of ``-q``/``--query`` (or
stdin) in order, each reply written to stdout, the first error to stderr with the
client's exit status (code mod 256), as clickhouse-client does. Any other option is
refused with a message naming it, and the runner lists such a test as needing
clickhouse-client.

Run by :mod:`tests.external_suites.clickhouse_stateless` with ``CHTX_STATELESS_URL`` and
``CHTX_STATELESS_DATABASE`` (``CHTX_STATELESS_USER`` / ``CHTX_STATELESS_PASSWORD``
when the server needs them) in the environment.
"""

from __future__ import annotations

import os
import sys

from tests.external_suites.http_session import HttpSession
from tests.external_suites.sql_script import split_statements

REFUSAL = "is not served by the HTTP stand-in of clickhouse-client"
_FLAGS = {"-n", "--multiquery", "-nm", "-mn", "--multiline", "-m"}


def parse_args(argv: list[str]) -> tuple[str | None, dict[str, str]]:
    """(query or None for stdin, URL settings); SystemExit(64) on an option it cannot serve."""
    query: str | None = None
    settings: dict[str, str] = {}
    it = iter(argv)
    for arg in it:
        if arg in ("-q", "--query"):
            query = next(it)
        elif arg.startswith("--query="):
            query = arg.split("=", 1)[1]
        elif arg == "--format":
            settings["default_format"] = next(it)
        elif arg.startswith("--format="):
            settings["default_format"] = arg.split("=", 1)[1]
        elif arg not in _FLAGS:
            print(f"clickhouse-client option {arg!r} {REFUSAL}", file=sys.stderr)
            raise SystemExit(64)
    return query, settings


def main(argv: list[str] | None = None) -> int:
    query, settings = parse_args(sys.argv[1:] if argv is None else argv)
    text = query if query is not None else sys.stdin.read()
    user = os.environ.get("CHTX_STATELESS_USER")
    auth = (user, os.environ.get("CHTX_STATELESS_PASSWORD", "")) if user else None
    session = HttpSession(os.environ["CHTX_STATELESS_URL"], os.environ["CHTX_STATELESS_DATABASE"], auth=auth)
    try:
        for st in split_statements(text):
            reply = session.run(st.text, **settings)
            sys.stdout.buffer.write(reply.body)
            sys.stdout.flush()
            if reply.code is not None:
                print(f"Received exception from server:\n{reply.message}", file=sys.stderr)
                return (reply.code % 256) or 1
    finally:
        session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
